"""``etmetal demo``: the main job, end to end.

For now it lowers the view_copy layout models with the stock config and with
``etmetal.backend_config()``, runs them on ExecuTorch's own runtime and prints the
comparison against eager (the ``regress view-copy`` matrix). The Metal delegate demo is
added as further sections.
"""

from __future__ import annotations

import argparse

from etmetal.scripts import regress_view_copy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--case",
        action="append",
        metavar="NAME",
        help="only this view_copy model (repeatable); default: all",
    )


def view_copy_section(case_names: list[str] | None = None) -> tuple[str, bool]:
    """The view_copy section's text and whether every etmetal row was exact."""
    from etmetal.scripts.models.view_copy import CASES, get_case

    cases = [get_case(name) for name in case_names] if case_names else CASES
    rows = regress_view_copy.run_matrix(cases)
    text = "\n".join(
        [
            "view_copy on channels-last and other layouts, run with executorch.runtime",
            "(stock = ExecutorchBackendConfig(...), etmetal = etmetal.backend_config(...)):",
            "",
            regress_view_copy.format_table(rows),
            "",
            regress_view_copy.summary(rows),
        ]
    )
    ok = all(row.exact for row in rows if row.lowering == "etmetal")
    return text, ok


def run(args: argparse.Namespace) -> int:
    try:
        text, ok = view_copy_section(args.case)
    except KeyError as exc:
        print(exc.args[0])
        return 2
    print(text)
    return 0 if ok else 1
