"""``etmetal bench all``: every suite, each in its own process, collected into one result.

A fresh process per suite keeps them apart: memory or caches one suite leaves behind
would colour the next. Each suite writes JSON; :func:`run_suites` collects it, and
:mod:`etmetal.bench.report` renders the markdown from those numbers only.
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

SUITES = ("delegate", "runtime", "overhead", "lowering", "metal", "imports")
# suites that report no targets: the only ones --update-md may replace on their own
UPDATABLE = ("metal", "imports")
# suites with neither models to scale nor intra-op threads (imports times fresh interpreters)
UNSIZED = ("imports",)


def suite_argv(suite: str, args: argparse.Namespace, out: Path) -> list[str]:
    argv = [suite, "--json", str(out)]
    if suite not in UNSIZED:
        argv += ["--threads", str(args.threads), "--scale", str(args.scale)]
    if args.quick:
        argv += {
            "delegate": ["--repeat", "5", "--budget", "5"],
            "runtime": ["--repeat", "3", "--budget", "5", "--instructions", "20"],
            "overhead": ["--repeat", "3", "--sizes-mib", "1", "--calls", "2000"],
            "lowering": ["--repeat", "1", "--cached-runs", "2", "--no-pte", "--model", "tiny"],
            "metal": ["--repeat", "3", "--launches", "20", "--kernel-runs", "3", "--budget", "5"],
            "imports": ["--runs", "1"],
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
