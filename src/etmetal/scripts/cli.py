"""The ``etmetal`` command line: one subcommand per module in this folder.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported only when their subcommand runs, so ``etmetal --help`` is fast
and a broken optional dependency only affects the command that needs it. Unless ``-v``
is given, the warnings and log lines of torch, torchao and ExecuTorch are dropped
(:mod:`etmetal.scripts.quiet`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from etmetal.scripts.quiet import quiet_loggers, silence_dependencies

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("etmetal.scripts.demo", "lower and run the demo models end to end"),
    "export": ("etmetal.scripts.export", "export a model to a .pte with the Metal partitioner"),
    "run": ("etmetal.scripts.run", "run a .pte with etmetal's runtime"),
    "regress": (
        "etmetal.scripts.regress",
        "run a regression suite (view-copy, cortex-m, backend-suite)",
    ),
    "bench": ("etmetal.scripts.bench", "benchmarks against the stock tools"),
    "doctor": ("etmetal.scripts.doctor", "report versions, compiler and usable targets"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="etmetal",
        description="Metal (AOTInductor) backend for ExecuTorch and a Python .pte runtime.",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show the warnings and log lines of torch, torchao and ExecuTorch",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    verbose = bool(argv) and argv[0] in ("-v", "--verbose")
    argv = argv[1:] if verbose else argv
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    # a command's own -v (``etmetal export -v``) asks for the same
    verbose = verbose or "-v" in argv[1:] or "--verbose" in argv[1:]
    if not verbose:
        silence_dependencies()
    name = argv[0]
    if name not in COMMANDS:
        parser.error(f"unknown command {name!r}; choose from {', '.join(COMMANDS)}")
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            print(f"etmetal {name}: not available in this build", file=sys.stderr)
            return 2
        raise
    sub = argparse.ArgumentParser(prog=f"etmetal {name}", description=help_text)
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    if not verbose:  # loggers that importing the command created with their own levels
        quiet_loggers()
    return int(module.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
