"""``etmetal bench native``: its arguments; :mod:`etmetal.bench.native_shims` measures the
native shims against the Python shims and torch's AOTI runner (tiny model, proxy model,
4-layer transformer, LM decode/prefill)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from etmetal.bench import native_shims


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="tiny", help="LM size: tiny (default) or 30m")
    parser.add_argument("--programs", metavar="DIR", help="keep the lowered LM programs here")
    parser.add_argument("--repeat", type=int, default=40, help="interleaved rounds per case")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per case at most")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--no-lm", action="store_true", help="only the tiny model")
    parser.add_argument("--write-md", metavar="PATH", help="write this suite's section here")


def run(args: argparse.Namespace) -> int:
    programs = Path(args.programs) if args.programs else None
    return native_shims.run_all(
        args.config,
        programs,
        args.repeat,
        args.budget,
        args.threads,
        not args.no_lm,
        write_md=Path(args.write_md) if args.write_md else None,
        command="etmetal bench native " + shlex.join(sys.argv[3:]),
    )
