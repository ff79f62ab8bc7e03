"""``etmetal regress cortex-m``: ExecuTorch's Cortex-M model zoo, lowered and run in
etmetal's runtime and checked against the flow's own reference
(:mod:`etmetal.testing.cortex_m_check`); prints a table or JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from dataclasses import asdict

from etmetal.examples.cortex_m_zoo import ZooCase, zoo
from etmetal.testing.cortex_m_check import CaseResult, run_case


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        default="all",
        help="comma-separated case names, or a group: all, models (the upstream model "
        "tests), modules (the small nn cases); default all",
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--list", action="store_true", help="list the zoo cases and exit")
    parser.add_argument("--no-cache", action="store_true", help="lower again even if cached")
    parser.add_argument("--cache-dir", default=None, help="cache root (default: user cache)")


def select_cases(spec: str) -> list[ZooCase]:
    cases = zoo()
    chosen: list[ZooCase] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item == "all":
            chosen += cases.values()
        elif item in ("models", "modules"):
            chosen += [c for c in cases.values() if c.group == item[:-1]]
        elif item in cases:
            chosen.append(cases[item])
        else:
            raise SystemExit(
                f"etmetal regress cortex-m: unknown zoo case {item!r}; known: {', '.join(cases)}"
            )
    unique = {c.name: c for c in chosen}
    return list(unique.values())


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def print_table(results: list[CaseResult], file=None) -> None:
    file = file or sys.stdout
    header = f"{'model':<22} {'ops':>3} {'max error':>10} {'steps':>6} {'tol':>9} {'exact':>5} {'result':<11} {'lower s':>7} {'run s':>7}"
    print(header, file=file)
    print("-" * len(header), file=file)
    for r in results:
        exact = "-" if r.exact_vs_dialect is None else ("yes" if r.exact_vs_dialect else "no")
        lower = _fmt(r.lower_seconds, ".1f") + ("*" if r.cached else " ")
        print(
            f"{r.model:<22} {r.ops:>3} {_fmt(r.max_error, '.3g'):>10} "
            f"{_fmt(r.max_error_steps, '.2f'):>6} {_fmt(r.tolerance, '.3g'):>9} {exact:>5} "
            f"{r.status:<11} {lower:>7} {_fmt(r.run_seconds, '.3f'):>7}",
            file=file,
        )
        if r.detail:
            print(f"    {r.detail}", file=file)
    counts = {
        s: sum(r.status == s for r in results) for s in ("pass", "fail", "error", "unavailable")
    }
    print(
        f"\n{counts['pass']} pass, {counts['fail']} fail, {counts['error']} error, "
        f"{counts['unavailable']} unavailable  (steps: error in output quantization steps; "
        "exact: bit-identical to the cortex_m dialect program on ExecuTorch's Python "
        "reference kernels; * lowering from cache)",
        file=file,
    )


def run(args: argparse.Namespace) -> int:
    cases = select_cases(args.models)
    if args.list:
        for case in cases:
            reason = case.unavailable()
            note = f"  [unavailable: {reason}]" if reason else ""
            print(f"{case.name:<22} {case.group:<7} qtol={case.qtol:<3} {case.source}{note}")
        return 0
    results = []
    # progress and anything the lowering prints go to stderr: stdout is the table or JSON
    with contextlib.redirect_stdout(sys.stderr):
        for case in cases:
            result = run_case(case, cache_dir=args.cache_dir, use_cache=not args.no_cache)
            results.append(result)
            print(f"  {case.name}: {result.status}", flush=True)
    if args.json:
        json.dump(
            {"suite": "cortex-m", "results": [asdict(r) for r in results]}, sys.stdout, indent=1
        )
        print()
    else:
        print_table(results)
    return 0 if all(r.status in ("pass", "unavailable") for r in results) else 1
