"""The measuring code of ``etmetal bench metal`` refuses to time a kernel whose result is
wrong. Timings are never asserted."""

from __future__ import annotations

import pytest

from etmetal.bench import metal as metal_bench


def test_a_wrong_kernel_result_is_refused_before_timing(monkeypatch, tmp_path):
    wrong = tmp_path / "plus_two.metal"
    wrong.write_text(metal_bench.KERNEL_SOURCE.read_text().replace("+ 1.0f", "+ 2.0f"))
    monkeypatch.setattr(metal_bench, "KERNEL_SOURCE", wrong)
    with pytest.raises(SystemExit, match="trivial kernel's result through the shims is wrong"):
        metal_bench.bench_dispatch(launches=2, n=40, repeat=1)
