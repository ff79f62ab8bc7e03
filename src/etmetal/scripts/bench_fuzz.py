"""``etmetal bench fuzz --cases N [--family operators] [--runtime stock]``: the seeded fuzz
campaign of :mod:`etmetal.testing.fuzz` over Metal-delegated programs, run by etmetal's
runtime or (``--runtime stock``, :mod:`etmetal.testing.fuzz_stock_worker`) by the stock
ExecuTorch runtime with etmetal's native backend; prints its outcome counts and the bad
cases."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from etmetal.testing.fuzz import build_seeds, run_campaign, summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", type=int, default=2000, help="cases to run (default 2000)")
    parser.add_argument("--seed", type=int, default=2026, help="campaign seed")
    parser.add_argument(
        "--family",
        choices=("delegate", "operators"),
        default="delegate",
        help="delegate: mutated delegated programs and shim calls; operators: operator "
        "tables naming random registered and unregistered operators",
    )
    parser.add_argument(
        "--runtime",
        choices=("etmetal", "stock"),
        default="etmetal",
        help="etmetal: etmetal's Python runtime; stock: executorch.runtime with etmetal's "
        "native MetalBackend (the delegate family's program kinds: pte, weights, processed)",
    )
    parser.add_argument(
        "--kinds",
        default=None,
        help="with --family delegate: comma-separated case kinds "
        "(default all: pte,weights,processed,shim,metal_shims; with --runtime stock: "
        "pte,weights,processed)",
    )


_WORKERS = {
    "etmetal": ("-m", "etmetal.testing.fuzz_worker"),
    "stock": ("-m", "etmetal.testing.fuzz_stock_worker"),
}


def run(args: argparse.Namespace) -> int:
    if args.runtime == "stock" and args.family != "delegate":
        raise SystemExit("--runtime stock runs the delegate family only")
    with tempfile.TemporaryDirectory(prefix="etmetal-fuzz-") as tmp:
        # the operators family edits its own x + 1 program: no delegated seeds to build
        seeds = build_seeds(Path(tmp)) if args.family == "delegate" else Path(tmp)
        start = time.perf_counter()
        kinds = args.kinds.split(",") if args.kinds else None
        by_kind: Counter = Counter()
        counts, bad = run_campaign(
            seeds,
            args.cases,
            args.seed,
            worker=_WORKERS[args.runtime],
            kinds=kinds,
            by_kind=by_kind,
            family=args.family,
        )
        elapsed = time.perf_counter() - start
    print(summary(counts) + f" ({elapsed:.1f} s, {args.runtime} runtime)")
    if by_kind:
        split = ", ".join(f"{k} {o}: {n}" for (k, o), n in sorted(by_kind.items()))
        print(f"  by kind: {split}")
    for line in bad[:20]:
        print("  " + line)
    return 0 if not bad else 1
