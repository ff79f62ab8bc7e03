"""The timing arms of ``etmetal bench native`` (:mod:`native_shims`, :mod:`native_transformer`):
CPU and wall time of arms run interleaved in one process, shim calls per run, and a
case's printed rows."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def _sample(fn: Callable[[], Any], inner: int) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - w0) / inner, (time.process_time() - c0) / inner


def interleaved_cpu(
    arms: Sequence[tuple[str, Callable[[], Any]]], repeat: int, inner: int, budget_s: float
) -> dict[str, tuple[float, float, float]]:
    """name -> (median wall s, median CPU s per call, median of the per-round CPU ratios
    over the first arm), the arms run in turns. The paired ratio compares samples taken
    back to back, so a load that drifts over the run moves both sides of each ratio."""
    for _, fn in arms:
        fn()
    walls: dict[str, list[float]] = {n: [] for n, _ in arms}
    cpus: dict[str, list[float]] = {n: [] for n, _ in arms}
    start = time.perf_counter()
    for rnd in range(repeat):
        for name, fn in arms:
            w, c = _sample(fn, inner)
            walls[name].append(w)
            cpus[name].append(c)
        if rnd >= 4 and time.perf_counter() - start > budget_s:
            break
    ref = cpus[arms[0][0]]
    return {
        n: (
            statistics.median(walls[n]),
            statistics.median(cpus[n]),
            statistics.median(c / r for c, r in zip(cpus[n], ref) if r > 0),
        )
        for n, _ in arms
    }


def interleaved_apart(
    arms: Sequence[tuple[str, Callable[[], Any]]],
    apart: set[str],
    repeat: int,
    inner: int,
    budget_s: float,
) -> dict[str, tuple[float, float, float]]:
    """``interleaved_cpu`` of ``arms``, but the arms named in ``apart`` (the Python-shims
    arms) run in rounds of their own with the first arm (torch's runner): switching the
    process to the reference implementation and back changes what the native arms' next
    run finds (measured on the LM's prefill: native x1.005 without a Python arm between
    its runs, x1.016 with one), which no native run outside this bench goes through. Their
    paired ratio is over the torch samples of their own rounds."""
    together = [a for a in arms if a[0] not in apart]
    timings = interleaved_cpu(together, repeat=repeat, inner=inner, budget_s=budget_s)
    separate = [a for a in arms if a[0] in apart]
    if separate:
        own = interleaved_cpu([arms[0], *separate], repeat=repeat, inner=inner, budget_s=budget_s)
        timings.update((name, own[name]) for name, _ in separate)
    return {name: timings[name] for name, _ in arms}


def counts_per_run(ctx, fn: Callable[[], Any], runs: int = 5) -> tuple[float, float]:
    """(native, Python) shim calls per call of ``fn`` on ``ctx``'s bridge."""
    fn()
    before = ctx.bridge.shim_counts()
    for _ in range(runs):
        fn()
    after = ctx.bridge.shim_counts()
    native = sum(a[0] - before.get(n, (0, 0))[0] for n, a in after.items())
    python = sum(a[1] - before.get(n, (0, 0))[1] for n, a in after.items())
    return native / runs, python / runs


def stock_counts_per_run(fn: Callable[[], Any], runs: int = 5) -> tuple[float, float]:
    """(native, Python) shim calls per call of ``fn`` in the stock runtime's backend."""
    from etmetal.stock_runtime import native_counts, shim_calls

    fn()
    before, calls = native_counts()["python_calls"], shim_calls()
    for _ in range(runs):
        fn()
    python = native_counts()["python_calls"] - before
    return (shim_calls() - calls - python) / runs, python / runs


def report(case: str, timings: dict[str, tuple[float, float, float]], counts: dict) -> dict:
    """Print ``case``'s arms (``interleaved_cpu``'s timings, the first torch's runner) and
    return its rows for ``render``."""
    ref_wall, ref_cpu, _ = timings["torch_aoti"]
    print(f"  {case}:")
    rows = {}
    for name, (wall, cpu, paired) in timings.items():
        line = f"    {name:16s} wall {wall * 1e6:10.1f} us  cpu {cpu * 1e6:10.1f} us"
        if name != "torch_aoti":
            line += (
                f"  x{wall / ref_wall:.3f} wall  x{cpu / ref_cpu:.3f} cpu (paired x{paired:.3f})"
            )
        if name in counts:
            native, python = counts[name]
            line += f"  shim calls/run: {native:.0f} in C, {python:.0f} to Python"
        print(line)
        rows[name] = {
            "wall_us": wall * 1e6,
            "cpu_us": cpu * 1e6,
            "paired": paired,
            "counts": counts.get(name),
        }
    return rows
