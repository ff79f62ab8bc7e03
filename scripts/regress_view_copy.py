"""``etmetal regress view-copy``: the ``view_copy`` layout matrix of
:mod:`etmetal.testing.view_copy_matrix` (stock vs etmetal lowering on the stock runtime,
error vs eager); exits non-zero if any etmetal row is not exact."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from etmetal.examples.view_copy import CASES, get_case
from etmetal.testing.view_copy_matrix import format_table, run_matrix, summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--case",
        action="append",
        metavar="NAME",
        help=f"only this model (repeatable): {', '.join(c.name for c in CASES)}",
    )


def run(args: argparse.Namespace) -> int:
    try:
        cases = [get_case(name) for name in args.case] if args.case else CASES
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    rows = run_matrix(cases)
    if args.json:
        print(
            json.dumps(
                [{**asdict(r), "status": r.status, "exact": r.exact} for r in rows], indent=2
            )
        )
    else:
        print(format_table(rows))
        print()
        print(summary(rows))
    return 0 if all(r.exact for r in rows if r.lowering == "etmetal") else 1
