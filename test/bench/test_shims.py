"""The measuring code of ``etmetal bench shims`` (numbers are reported, never asserted)."""

from __future__ import annotations

from etmetal.bench import shims as bench_shims


def test_native_driver_reaches_every_pattern():
    results = bench_shims.bench_calls(200)
    assert set(results) == set(bench_shims.PATTERNS.values())
    assert all(ns > 0 for ns in results.values())


def test_gather_rows_cover_each_layout():
    rows = bench_shims.bench_gather(1)  # also checks the gathered values against eager slicing
    assert [r[0] for r in rows][0] == "contiguous copy"
    assert len(rows) == 3 and all(gbs > 0 for _, gbs, _ in rows)
