"""``etmetal bench all``: run every suite, each in its own process, and write BENCHMARKS.md.

A fresh process per suite keeps them apart: memory or caches one suite leaves behind
would colour the next. Each suite writes JSON; this module collects
it and renders the markdown from those numbers only.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from etmetal.bench import timing as bm

SUITES = ("delegate", "runtime", "overhead", "lowering", "metal")
# suites that report no targets: the only ones --update-md may replace on their own
UPDATABLE = ("metal",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suites", default=",".join(SUITES), help="comma-separated suites")
    parser.add_argument("--write-md", metavar="PATH", help="write the markdown report here")
    parser.add_argument(
        "--update-md",
        metavar="PATH",
        help="replace only these suites' sections in an existing report (suites without targets)",
    )
    parser.add_argument("--json", metavar="PATH", help="write all suites' JSON here ('-' = stdout)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--scale", type=int, default=1, help="divide model sizes (1 = full)")
    parser.add_argument(
        "--quick", action="store_true", help="few rounds (a smoke run; numbers are rough)"
    )


def suite_argv(suite: str, args: argparse.Namespace, out: Path) -> list[str]:
    argv = [suite, "--json", str(out), "--threads", str(args.threads), "--scale", str(args.scale)]
    if args.quick:
        argv += {
            "delegate": ["--repeat", "5", "--budget", "5"],
            "runtime": ["--repeat", "3", "--budget", "5", "--instructions", "20"],
            "overhead": ["--repeat", "3", "--sizes-mib", "1", "--calls", "2000"],
            "lowering": ["--repeat", "1", "--cached-runs", "2", "--no-pte", "--model", "tiny"],
            "metal": ["--repeat", "3", "--launches", "20", "--kernel-runs", "3", "--budget", "5"],
        }[suite]
    return argv


def run_suites(args: argparse.Namespace) -> dict[str, Any]:
    names = [s for s in args.suites.split(",") if s]
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        raise SystemExit(f"bench all: unknown suite(s) {unknown}; choose from {SUITES}")
    docs: dict[str, Any] = {}
    commands: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="etmetal-bench-") as tmp:
        for name in names:
            out = Path(tmp) / f"{name}.json"
            argv = [
                sys.executable,
                "-m",
                "etmetal.scripts.cli",
                "bench",
                *suite_argv(name, args, out),
            ]
            shown = suite_argv(name, args, Path("OUT.json"))
            commands[name] = "etmetal bench " + shlex.join(shown)
            print(f"== {commands[name]}", flush=True)
            t0 = time.perf_counter()
            proc = subprocess.run(argv)
            if proc.returncode != 0:
                raise SystemExit(f"bench all: suite {name!r} failed (exit {proc.returncode})")
            docs[name] = json.loads(out.read_text())
            docs[name]["wall_s"] = time.perf_counter() - t0
    return {"machine": bm.machine(), "suites": docs, "commands": commands}


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    fixed = [s for s in args.suites.split(",") if s and s not in UPDATABLE]
    if args.update_md and fixed:
        raise SystemExit(
            f"bench all --update-md: suites {fixed} report targets; regenerate with --write-md"
        )
    t0 = time.time()
    result = run_suites(args)
    result["started_utc"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))
    result["command"] = "etmetal bench all " + shlex.join(sys.argv[3:])
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.write_md:
        from etmetal.bench.llm import carry_section  # bench llm runs on its own
        from etmetal.scripts.bench_report import render

        Path(args.write_md).write_text(carry_section(Path(args.write_md), render(result)))
        print(f"wrote {args.write_md}")
    if args.update_md:
        from etmetal.scripts.bench_report import update

        path = Path(args.update_md)
        path.write_text(update(path.read_text(), result))
        print(f"updated {args.update_md}")
    return 0
