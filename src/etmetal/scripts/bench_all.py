"""``etmetal bench all``: its arguments, and where the results go (JSON, BENCHMARKS.md).

The suites run in :mod:`etmetal.bench.all_suites`; the markdown is
:mod:`etmetal.bench.report`'s."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from etmetal.bench import all_suites as suites


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suites", default=",".join(suites.SUITES), help="comma-separated suites")
    parser.add_argument("--write-md", metavar="PATH", help="write the markdown report here")
    parser.add_argument(
        "--update-md",
        metavar="PATH",
        help="replace only these suites' sections in an existing report (suites without targets)",
    )
    parser.add_argument("--json", metavar="PATH", help="write all suites' JSON here ('-' = stdout)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--scale", type=int, default=1, help="divide model sizes (1 = full)")
    parser.add_argument(
        "--quick", action="store_true", help="few rounds (a smoke run; numbers are rough)"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    fixed = [s for s in args.suites.split(",") if s and s not in suites.UPDATABLE]
    if args.update_md and fixed:
        raise SystemExit(
            f"bench all --update-md: suites {fixed} report targets; regenerate with --write-md"
        )
    t0 = time.time()
    result = suites.run_suites(args)
    result["started_utc"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))
    result["command"] = "etmetal bench all " + shlex.join(sys.argv[3:])
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.write_md:
        from etmetal.bench.report import render
        from etmetal.bench.sections import carry_sections  # bench llm and native run alone

        Path(args.write_md).write_text(carry_sections(Path(args.write_md), render(result)))
        print(f"wrote {args.write_md}")
    if args.update_md:
        from etmetal.bench.report import update

        path = Path(args.update_md)
        path.write_text(update(path.read_text(), result))
        print(f"updated {args.update_md}")
    return 0
