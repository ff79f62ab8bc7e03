"""``etmetal bench fuzz --cases N``: the seeded fuzz campaign of :mod:`etmetal.testing.fuzz`
over Metal-delegated programs; prints its outcome counts and the bad cases."""

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
        "--kinds",
        default=None,
        help="comma-separated case families (default all: pte,weights,processed,shim,mps)",
    )


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="etmetal-fuzz-") as tmp:
        seeds = build_seeds(Path(tmp))
        start = time.perf_counter()
        kinds = args.kinds.split(",") if args.kinds else None
        by_kind: Counter = Counter()
        counts, bad = run_campaign(seeds, args.cases, args.seed, kinds=kinds, by_kind=by_kind)
        elapsed = time.perf_counter() - start
    print(summary(counts) + f" ({elapsed:.1f} s)")
    split = ", ".join(f"{k} {o}: {n}" for (k, o), n in sorted(by_kind.items()))
    print(f"  by family: {split}")
    for line in bad[:20]:
        print("  " + line)
    return 0 if not bad else 1
