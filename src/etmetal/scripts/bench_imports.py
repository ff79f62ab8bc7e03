"""``etmetal bench imports``: its arguments, and the printing of what
:mod:`etmetal.bench.imports` measures (import time in fresh interpreters, wall and CPU)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from etmetal.bench import imports as ib
from etmetal.bench import timing as bm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON ('-' = stdout)"
    )
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per module")
    parser.add_argument(
        "--modules", default=",".join(ib.MODULES), help="comma-separated modules to import"
    )


def collect(args: argparse.Namespace) -> dict[str, Any]:
    modules = [m for m in args.modules.split(",") if m]
    print(f"import time in a fresh interpreter, median of {args.runs} (wall, CPU = user + sys):")
    rows = ib.measure(modules, args.runs)
    wall, cpu = rows[0].timings, rows[1].timings
    for m in modules:
        limit = ib.TARGET_S.get(m)
        verdict = ""
        if limit is not None:
            met = {row.case: row.extra["met_s"][m] for row in rows}
            verdict = f"  (target < {limit} s: wall {_word(met['wall'])}, cpu {_word(met['cpu'])})"
        print(f"  {m:22s} wall {wall[m].median_s:6.2f} s  cpu {cpu[m].median_s:6.2f} s{verdict}")
    load = rows[0].extra["loadavg"]
    if load:
        print(f"  load average {load[0]:.1f} on {os.cpu_count()} cores: wall > cpu means waiting")
    return bm.emit(args, "imports", rows)


def _word(met: bool) -> str:
    return "met" if met else "MISSED"
