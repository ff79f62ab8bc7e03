"""``etmetal bench isolation``: its arguments, and the printing of what
:mod:`etmetal.bench.isolation` measures."""

from __future__ import annotations

import argparse

import torch

from etmetal.bench import isolation as ib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=300, help="timed executes per mode")
    parser.add_argument("--models", nargs="*", default=None, help="demo models (default all)")
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads (default 1)")


def run(args: argparse.Namespace) -> int:
    from etmetal.examples.demo import DEMO_MODELS

    torch.set_num_threads(args.threads)  # the worker takes the host's thread count
    names = args.models or [m.name for m in DEMO_MODELS]
    print(f"{'model':<20} {'in-process us':>14} {'isolated us':>12} {'ratio':>6} {'spawn s':>8}")
    for name in names:
        c = ib.measure(name, args.runs)
        print(
            f"{name:<20} {c.in_process_us:>14.1f} {c.isolated_us:>12.1f} {c.ratio:>6.2f} "
            f"{c.spawn_s:>8.2f}"
        )
    return 0
