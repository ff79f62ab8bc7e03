"""``etmetal regress metal-check``: the Metal registry's modules and the demo models lowered
for ``mps_emulated`` and run under the Metal checker (:mod:`etmetal.testing.metal_check_flow`);
prints a row per model (faults, match with eager, checked accesses, unchecked and checked
execute time) and exits non-zero if any model has a fault, a mismatch or an error."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from etmetal.scripts.suites import add_only_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed executes per mode, interleaved (median; default 5)",
    )
    add_only_option(
        parser, "--model", "only this model (repeatable): a registry name or demo:<name>"
    )


def run(args: argparse.Namespace) -> int:
    from etmetal.testing.metal_check_flow import check_model, model_names

    known = model_names()
    names = args.model or known
    unknown = [n for n in names if n not in known]
    if unknown:
        print(
            f"etmetal regress metal-check: unknown model {unknown[0]!r}; known: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    results = []
    for name in names:
        r = check_model(name, repeats=max(args.repeats, 1))
        results.append(r)
        if not args.json:
            status = (
                "clean"
                if r.clean
                else ("ERROR" if r.error else "FAULTS" if r.faults else "MISMATCH")
            )
            print(
                f"{r.name:36s} {status:8s} faults {len(r.faults):3d}  accesses {r.checked_accesses:>10d}"
                f"  unchecked {r.unchecked_ms:9.2f} ms  checked {r.checked_ms:9.2f} ms"
                f"  x{r.slowdown:.1f}",
                flush=True,
            )
            for line in r.faults[:5] + ([r.error] if r.error else []):
                print(f"    {line}")
    if args.json:
        print(json.dumps([asdict(r) | {"clean": r.clean} for r in results], indent=2))
    else:
        clean = sum(r.clean for r in results)
        print(f"{clean} of {len(results)} models clean under memcheck,racecheck")
    return 0 if all(r.clean for r in results) else 1
