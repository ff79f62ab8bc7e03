"""``etmetal regress view-copy``: the ``view_copy`` layout matrix of
:mod:`etmetal.testing.view_copy_matrix` (stock vs etmetal lowering on the stock runtime,
error vs eager); exits non-zero if any etmetal row is not exact."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from etmetal.examples.view_copy import CASES, get_case
from etmetal.scripts.suites import add_only_option
from etmetal.testing.view_copy_matrix import format_table, run_matrix, summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_only_option(
        parser, "--case", f"only this model (repeatable): {', '.join(c.name for c in CASES)}"
    )
    parser.add_argument(
        "--generated",
        type=int,
        metavar="N",
        help="instead of the named cases, the first N seeded random layout programs "
        "(etmetal.testing.layout_programs): counts per lowering",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --generated (default 0)")
    add_only_option(
        parser,
        "--program",
        "only this generated program, e.g. gen0-190 (repeatable; implies --generated)",
    )
    parser.add_argument(
        "--progress", action="store_true", help="with --generated: a line per program on stderr"
    )


def run_generated(args: argparse.Namespace) -> int:
    from etmetal.testing.layout_programs import program_named
    from etmetal.testing.layout_property import format_property_table, run_property

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        programs = [program_named(name) for name in args.program] if args.program else None
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    result = run_property(
        args.generated or 0,
        seed=args.seed,
        progress=progress if args.progress else None,
        programs=programs,
    )
    print(format_property_table(result))
    return 0 if result.ok else 1


def run(args: argparse.Namespace) -> int:
    if getattr(args, "generated", None) is not None or getattr(args, "program", None):
        return run_generated(args)
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
