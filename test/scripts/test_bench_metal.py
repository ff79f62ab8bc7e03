"""``etmetal bench metal`` at tiny sizes: the JSON and markdown it produces, and that it
refuses to time a kernel or model whose result is wrong. Timings are never asserted."""

from __future__ import annotations

import argparse

import pytest

from etmetal.bench import metal as metal_bench
from etmetal.bench import report as bench_report
from etmetal.scripts import bench_metal


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_metal.add_arguments(parser)
    return parser.parse_args(argv)


def test_metal_suite_reports_launches_kernels_and_the_emulated_host_ratio():
    argv = ["--models", "patch_embedding", "--repeat", "2", "--launches", "5"]
    doc = bench_metal.collect(
        _args([*argv, "--kernel-runs", "2", "--budget", "2", "--cold-compiles", "0"])
    )
    assert doc["suite"] == "metal"
    dispatch, kernels, ratio = doc["rows"]
    # the driver's launches reached the shims and computed in + 1 (checked by the suite)
    assert set(dispatch["median_us"]) == {"shims", "executor", "executor_from_python"}
    assert dispatch["extra"]["shim_calls_per_launch"] == metal_bench.SHIM_CALLS_PER_LAUNCH
    # the patch embedding's Metal kernels: at least its layer norm, a threadgroup reduction
    found = kernels["extra"]["kernels"]
    assert found and all(k["dispatches_per_run"] >= 1 for k in found)
    assert any("threadgroup" in k["does"] for k in found)
    assert 0 < kernels["extra"]["kernel_share"] <= 1.0
    assert ratio["case"] == "patch_embedding"
    assert set(ratio["median_us"]) == {"host", "mps_emulated", "eager"}
    assert all(e <= 1e-4 for e in ratio["extra"]["max_abs_err_vs_eager"].values())
    assert ratio["extra"]["best_ratio"] > 0
    md = bench_report.render(
        {
            "machine": doc["machine"],
            "suites": {"metal": {**doc, "wall_s": 1.0}},
            "commands": {"metal": "etmetal bench metal"},
            "command": "etmetal bench all --suites metal",
            "started_utc": "now",
        }
    )
    assert "## Emulated Metal device" in md and "mps_emulated/host = " in md
    assert "instead of its median: patch_embedding " in md
    for k in found:
        assert f"| {k['kernel']} | {k['grid']} | {k['threadgroup']} |" in md
    # --update-md: the metal section replaced (or added), every other line kept
    result = {
        "machine": doc["machine"],
        "suites": {"metal": {**doc, "wall_s": 1.0}},
        "commands": {"metal": "etmetal bench metal --quick"},
        "command": "etmetal bench all --suites metal --update-md B.md",
        "started_utc": "later",
    }
    old = "# etmetal benchmarks\n\n## Other suite\n\nkept 1.0 us\n"
    added = bench_report.update(old, result)
    assert added.startswith(old) and "`etmetal bench metal --quick`" in added
    assert "--update-md B.md`, run later" in added
    result["commands"]["metal"] = "etmetal bench metal --second"
    again = bench_report.update(added + "\n## Later suite\n\nkept 2.0 us\n", result)
    assert again.count("## Emulated Metal device") == 1 and "--quick" not in again
    assert "`etmetal bench metal --second`" in again
    assert again.startswith(old) and again.endswith("## Later suite\n\nkept 2.0 us\n")


def test_unknown_model_is_refused():
    with pytest.raises(SystemExit, match="unknown model"):
        bench_metal.collect(_args(["--models", "resnet9000"]))


def test_a_cold_compile_sample_that_fails_names_the_model():
    from etmetal.bench.cold_compile import bench_cold_compile

    with pytest.raises(SystemExit, match="resnet9000"):
        bench_cold_compile("resnet9000", 1)
