"""``etmetal regress backend-suite``: ExecuTorch's backend conformance suite once per flow
(``portable``, ``etmetal``, ``metal_host``, ``metal_stock``, ``metal_emulated``; see :mod:`etmetal.testing.backend_suite`); prints
pass/fail/skip counts, failure causes and every case that passes on one flow only."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flows", nargs="+", default=["portable", "etmetal"])
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    parser.add_argument("--files", nargs="*", default=None, help="operator test files only")
    parser.add_argument("-n", dest="workers", type=int, default=1, help="xdist workers")
    parser.add_argument("--json", default=None, help="write the summary here")
    parser.add_argument(
        "--no-timeout", action="store_true", help="drop the suite's per-case time limits"
    )


def run(args: argparse.Namespace) -> int:
    # imported here: importing the plugin registers its flows with ExecuTorch's suite
    from etmetal.testing.backend_suite import (
        compare,
        delegated_tests,
        failure_causes,
        failure_stages,
        run_flows,
        skip_reasons,
    )

    extra: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="etmetal-suite-") as tmp:
        results = run_flows(
            args.flows,
            Path(tmp),
            files=args.files,
            keyword=args.keyword,
            workers=args.workers,
            timeouts=not args.no_timeout,
        )
        xml_path = Path(tmp) / "suite.xml"
        for f in args.flows:
            have = xml_path.exists()
            extra[f] = {
                "failure_causes": failure_causes(xml_path, f) if have else [],
                "failure_stages": failure_stages(xml_path, f) if have else [],
                "skip_reasons": skip_reasons(xml_path, f) if have else [],
            }
            delegated = delegated_tests(Path(tmp), f)
            if delegated:
                extra[f]["delegated_pass"] = sorted(
                    t for t, v in results[f].items() if v == "pass" and t in delegated
                )
    summary = compare(results)
    summary["details"] = extra
    for flow, counts in summary["counts"].items():
        print(
            f"{flow:>10}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['skip']} skipped of {counts['total']}"
        )
    for flow, info in extra.items():
        if "delegated_pass" in info:
            passed = summary["counts"][flow]["pass"]
            print(
                f"{flow:>10}: {len(info['delegated_pass'])} of {passed} passes ran delegated "
                "programs (the rest lowered nothing to the delegate)"
            )
            delegated = set(info["delegated_pass"])
            for case in sorted(t for t, v in results[flow].items() if v == "pass"):
                if case not in delegated:
                    print(f"    no delegate: {case}")
        for key, title in (
            ("failure_stages", "failure stages"),
            ("failure_causes", "failure causes"),
            ("skip_reasons", "skip reasons"),
        ):
            if info[key]:
                print(f"{flow:>10}: top {title}:")
                for n, cause in info[key]:
                    print(f"    {n:4d}  {cause}")
    for label, cases in summary["regressions"].items():
        print(f"{label}: {len(cases)}")
        for case in cases:
            print(f"    {case}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, **summary}, indent=1))
    etmetal_worse = summary["regressions"].get("pass on portable, not on etmetal", [])
    return 1 if etmetal_worse else 0
