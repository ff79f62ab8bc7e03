"""``etmetal bench runtime``: its arguments, and the printing of what
:mod:`etmetal.bench.runtime` measures."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from etmetal.bench import runtime as rb
from etmetal.bench import timing as bm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bm.add_common_arguments(parser, repeat=15, models=rb.MODELS)
    parser.add_argument(
        "--instructions", type=int, default=200, help="kernel calls in the loop-overhead program"
    )


def collect(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    print(f"runtime latency, median of interleaved runs ({torch.get_num_threads()} thread(s)):")
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        if name not in rb.MODELS:
            raise SystemExit(f"bench runtime: unknown model {name!r}; choose from {rb.MODELS}")
        rows.append(rb.bench_model(name, args))
        bm.print_comparison(rows[-1])
    row = rb.bench_loop_overhead(args)
    rows.append(row)
    bm.print_comparison(row)
    e = row.extra
    print(
        f"  per instruction: etmetal {e['us_per_instruction']['etmetal']:.2f} us, stock "
        f"{e['us_per_instruction']['stock']:.2f} us, bare ATen call "
        f"{e['us_per_instruction']['aten_calls']:.2f} us; etmetal loop overhead (no-op kernels) "
        f"{e['etmetal_overhead_us_per_instruction']:.2f} us (target < "
        f"{rb.TARGET_US_PER_INSTRUCTION} us: {'met' if e['met_overhead'] else 'MISSED'})"
    )
    return bm.emit(args, "runtime", rows)
