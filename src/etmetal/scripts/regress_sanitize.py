"""``etmetal regress sanitize``: the shim, delegate and fuzz tests with the native layer
built under AddressSanitizer and UBSan (:mod:`etmetal.testing.sanitize`)."""

from __future__ import annotations

import argparse

from etmetal.common.native_build import SANITIZERS
from etmetal.testing import sanitize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "tests",
        nargs="*",
        default=list(sanitize.DEFAULT_TESTS),
        help=f"test paths, from the repository root (default: {' '.join(sanitize.DEFAULT_TESTS)})",
    )
    parser.add_argument(
        "--sanitizers",
        default=",".join(SANITIZERS),
        help=f"comma-separated, of {', '.join(SANITIZERS)} (default: both)",
    )
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest workers (default 2)")
    parser.add_argument("-k", dest="select", help="pytest -k expression")


def run(args: argparse.Namespace) -> int:
    sanitizers = [s for s in args.sanitizers.split(",") if s]
    extra = ["-k", args.select] if args.select else []
    rc = sanitize.run_tests(args.tests, sanitizers=sanitizers, workers=args.workers, extra=extra)
    verdict = {0: "clean", 86: "AddressSanitizer report", 87: "UBSan report"}.get(rc, "failed")
    print(f"regress sanitize ({','.join(sanitizers)}): {verdict} (exit {rc})")
    return rc
