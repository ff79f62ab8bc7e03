"""``etmetal bench lowering``: its arguments, and the printing of what
:mod:`etmetal.bench.lowering` measures."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from etmetal.bench import lowering as lb
from etmetal.bench import timing as bm
from etmetal.examples.bench import models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bm.add_common_arguments(parser, repeat=2)
    parser.add_argument("--model", default="mlp", help="which benchmark model to lower")
    parser.add_argument(
        "--cached-runs", type=int, default=5, help="cached runs after each cold one"
    )
    parser.add_argument("--no-pte", action="store_true", help="time the AOTI compile only")


def collect(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    table = models(args.scale)
    if args.model not in table:
        raise SystemExit(f"bench lowering: unknown model {args.model!r}; choose from {list(table)}")
    spec = table[args.model]
    module, inputs = spec.make_module(), spec.make_inputs()
    print(f"lowering time of {spec.description}, cold (empty cache) vs cached:")
    ep = torch.export.export(module, inputs, strict=False)
    rows = [lb.bench_aoti(ep, args)]
    bm.print_comparison(rows[-1])
    if not args.no_pte:
        rows.append(lb.bench_pte(module, inputs, args))
        bm.print_comparison(rows[-1])
    for r in rows:
        r.extra["model"] = spec.description
    return bm.emit(args, "lowering", rows)
