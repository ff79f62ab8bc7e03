"""``etmetal bench imports``: what importing a package costs a fresh interpreter.

Every CLI call, isolated-delegate worker and test subprocess starts a new Python and
imports the runtime, so its import time is paid again each time. Each sample is one
``python -c "import MODULE"`` in a new process; the modules take turns (A, B, C, A, ...)
so load drifts hit all alike. Wall time comes from the parent's clock, CPU time (user +
system) from the child's resource usage; on a busy machine wall exceeds CPU, and the
CPU time is the steadier figure.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from etmetal.bench import timing as bm

# ``import torch`` is the floor every module here pays; executorch.runtime is upstream's
# runtime, the thing etmetal's is compared with
MODULES = ("torch", "etmetal.runtime", "etmetal.shims", "executorch.runtime")
TARGET_S = {"etmetal.runtime": 3.0}  # issue 23: a fresh interpreter imports it in under 3 s


def time_import(module: str) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh interpreter that imports ``module`` and exits."""
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: the child never blocks on it
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import {module}"], stdout=subprocess.DEVNULL, stderr=err
        )
        # wait4 reports this child's own resource usage (RUSAGE_CHILDREN would sum all)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
        if proc.returncode != 0:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines() or ["(no output)"]
            raise SystemExit(
                f"bench imports: 'import {module}' failed (exit {proc.returncode}): {lines[-1]}"
            )
    return wall, usage.ru_utime + usage.ru_stime


def measure(modules: Sequence[str], runs: int) -> list[bm.Comparison]:
    """Two rows, ``wall`` and ``cpu``: each module's median over ``runs`` fresh interpreters."""
    if not modules:
        raise ValueError("bench imports: no modules to import")
    wall: dict[str, list[float]] = {m: [] for m in modules}
    cpu: dict[str, list[float]] = {m: [] for m in modules}
    for _ in range(runs):
        for module in modules:
            w, c = time_import(module)
            wall[module].append(w)
            cpu[module].append(c)
    rows = []
    for case, samples in (("wall", wall), ("cpu", cpu)):
        timings = {
            m: bm.Timing(m, statistics.median(s), min(s), len(s), s) for m, s in samples.items()
        }
        row = bm.Comparison("imports", case, timings)
        for m in modules:
            if m != "torch" and "torch" in timings:
                row.add_ratio(m, "torch")
        row.extra.update(
            target_s_at_most={m: t for m, t in TARGET_S.items() if m in timings},
            met_s={m: timings[m].median_s < t for m, t in TARGET_S.items() if m in timings},
            loadavg=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        )
        rows.append(row)
    return rows
