"""``etmetal bench delegate``: its arguments, and the printing of what
:mod:`etmetal.bench.delegate` measures."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from etmetal.bench import delegate as db
from etmetal.bench import timing as bm
from etmetal.examples.bench import models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bm.add_common_arguments(parser, repeat=30, models=db.MODELS)
    parser.add_argument(
        "--no-pte", action="store_true", help="skip the full .pte delegate path (shims only)"
    )


def collect(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    print(f"delegate latency, median of interleaved runs ({torch.get_num_threads()} thread(s)):")
    rows = []
    names = [m for m in args.models.split(",") if m]
    for name in names:
        if name not in models():
            raise SystemExit(f"bench delegate: unknown model {name!r}; choose from {db.MODELS}")
    prepared = [db.prepare(name, args) for name in names]
    with tempfile.TemporaryDirectory(prefix="etmetal-bench-") as tmp:
        for p in prepared:
            rows.append(db.bench_model(p, args, Path(tmp)))
            bm.print_comparison(rows[-1])
    return bm.emit(args, "delegate", rows)
