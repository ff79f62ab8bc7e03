"""``etmetal bench lowering``: AOTI lowering time, cold vs cached.

``aoti`` rows time ``compile_exported_program`` alone; ``pte`` rows time the whole
user path (``to_edge_transform_and_lower`` with ``MetalPartitioner`` and
``to_executorch``), whose preprocess goes through the same cache. Cold runs use a
fresh, empty cache directory (one per sample: a cold compile takes tens of seconds,
so few samples); cached runs reuse the entry the cold run wrote. The two are
alternated (cold, cached, cold, cached, ...).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from etmetal.bench import timing as bm

TARGET = 0.1


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cold_and_cached(
    make: Callable[[Path], Callable[[], Any]], repeat: int, cached_runs: int
) -> dict[str, bm.Timing]:
    cold, cached = [], []
    for _ in range(repeat):
        root = Path(tempfile.mkdtemp(prefix="etmetal-bench-cache-"))
        try:
            fn = make(root)
            cold.append(_time(fn))
            cached.extend(_time(fn) for _ in range(cached_runs))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "cold": bm.Timing("cold", statistics.median(cold), min(cold), len(cold)),
        "cached": bm.Timing("cached", statistics.median(cached), min(cached), len(cached)),
    }


def bench_aoti(ep: torch.export.ExportedProgram, args: argparse.Namespace) -> bm.Comparison:
    from etmetal.backend.aoti_compile import compile_exported_program

    def make(root: Path):
        def fn():
            art = compile_exported_program(ep, cache_dir=root)
            return art

        return fn

    row = bm.Comparison("lowering", "aoti", _cold_and_cached(make, args.repeat, args.cached_runs))
    row.add_ratio("cached", "cold", TARGET)
    return row


def bench_pte(module, inputs, args: argparse.Namespace) -> bm.Comparison:
    from executorch.exir import to_edge_transform_and_lower

    import etmetal

    def make(root: Path):
        def fn():
            previous = os.environ.get("ETMETAL_CACHE_DIR")
            os.environ["ETMETAL_CACHE_DIR"] = str(root)
            try:
                ep = torch.export.export(module, inputs, strict=False)
                prog = to_edge_transform_and_lower(ep, partitioner=[etmetal.MetalPartitioner()])
                return prog.to_executorch(etmetal.backend_config()).buffer
            finally:
                if previous is None:
                    os.environ.pop("ETMETAL_CACHE_DIR", None)
                else:
                    os.environ["ETMETAL_CACHE_DIR"] = previous

        return fn

    row = bm.Comparison("lowering", "pte", _cold_and_cached(make, args.repeat, args.cached_runs))
    row.add_ratio("cached", "cold", TARGET)
    return row
