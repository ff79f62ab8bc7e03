"""Shared plumbing for commands with named suites (``etmetal regress X``, ``etmetal bench X``).

Each suite is a module with ``add_arguments(parser)`` and either ``run(args) -> int``
or, for a benchmark that returns its results, ``collect(args)`` (exit status 0);
imported only when chosen.
"""

from __future__ import annotations

import argparse
import importlib


def make_command(suites: dict[str, tuple[str, str]]):
    """Return ``(add_arguments, run)`` for a command whose subcommands are ``suites``."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)
        for name, (module_name, help_text) in suites.items():
            suite_parser = sub.add_parser(name, help=help_text, description=help_text)
            suite_parser.set_defaults(_suite_module=module_name)
            try:
                importlib.import_module(module_name).add_arguments(suite_parser)
            except ModuleNotFoundError as exc:
                if exc.name != module_name:
                    raise
                suite_parser.set_defaults(_suite_missing=True)

    def run(args: argparse.Namespace) -> int:
        if getattr(args, "_suite_missing", False):
            print(f"suite {args.suite!r} is not available in this build")
            return 2
        module = importlib.import_module(args._suite_module)
        if not hasattr(module, "run"):
            module.collect(args)
            return 0
        return int(module.run(args) or 0)

    return add_arguments, run


def add_only_option(parser: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    """A repeatable ``FLAG NAME`` that restricts the command to the items named."""
    parser.add_argument(flag, action="append", metavar="NAME", help=help_text)
