"""Smoke tests of ``etmetal bench`` suites at tiny sizes.

They check the JSON structure and that the compared arms computed the same thing
(etmetal vs the stock runtime / torch's AOTI runner vs eager). Timings are reported
by the suites, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etmetal.bench import report as bench_report
from etmetal.scripts import bench_lowering, bench_overhead, bench_runtime

ROW_KEYS = {"suite", "case", "median_us", "min_us", "samples", "ratios", "targets_at_most", "met"}


def _args(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def _check_doc(doc: dict, suite: str) -> None:
    assert doc["suite"] == suite
    assert {"nproc", "cpu", "torch", "executorch"} <= set(doc["machine"])
    for row in doc["rows"]:
        assert set(row) >= ROW_KEYS, row
        assert all(v > 0 for v in row["median_us"].values())
        for name, ratio in row["ratios"].items():
            num, den = name.split("/")
            assert ratio == pytest.approx(row["median_us"][num] / row["median_us"][den])
        assert set(row["met"]) == set(row["targets_at_most"])


def _run_cli(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    # a fresh process: torch's AOTI runner must load before etmetal's bridge does
    return subprocess.run(
        [sys.executable, "-m", "etmetal.scripts.cli", "bench", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "ETMETAL_PROGRESS": "0"},
        timeout=600,
    )


def test_runtime_suite_matches_stock_and_eager(tmp_path):
    out = tmp_path / "runtime.json"
    args = _args(
        bench_runtime,
        ["--scale", "16", "--models", "mlp", "--repeat", "2", "--instructions", "6"],
    )
    args.json = str(out)
    doc = bench_runtime.collect(args)
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(doc["rows"]))
    _check_doc(doc, "runtime")
    mlp, loop = doc["rows"]
    assert mlp["case"] == "mlp" and set(mlp["median_us"]) == {"stock", "etmetal", "eager"}
    assert set(mlp["ratios"]) == {"etmetal/stock", "etmetal/eager"}
    # both runtimes ran the same .pte and matched eager before anything was timed
    errs = mlp["extra"]["max_abs_err_vs_eager"]
    assert errs["etmetal"] <= 1e-4 and errs["stock"] <= 1e-3
    assert mlp["extra"]["calls_per_sample"]["stock"] == 1
    assert loop["extra"]["instructions"] >= 6
    assert set(loop["extra"]["us_per_instruction"]) == {
        "stock",
        "etmetal",
        "aten_calls",
        "etmetal_noop_kernels",
    }


def test_runtime_suite_rejects_unknown_model():
    args = _args(bench_runtime, ["--models", "resnet9000"])
    with pytest.raises(SystemExit, match="unknown model 'resnet9000'"):
        bench_runtime.collect(args)


def test_delegate_suite_matches_torch_aoti(tmp_path):
    proc = _run_cli(
        ["delegate", "--models", "tiny", "--repeat", "2", "--no-pte", "--json", "d.json"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "d.json").read_text())
    _check_doc(doc, "delegate")
    (row,) = doc["rows"]
    assert set(row["median_us"]) == {"torch_aoti", "etmetal_shims"}
    assert row["targets_at_most"] == {"etmetal_shims/torch_aoti": 3.0}
    errs = row["extra"]["max_abs_err_vs_eager"]
    assert errs["torch_aoti"] <= 1e-6 and errs["etmetal_shims"] <= 1e-6
    assert row["extra"]["shim_calls_per_run"] > 0


def test_overhead_suite_copies_agree():
    args = _args(bench_overhead, ["--sizes-mib", "0.25", "--repeat", "2", "--calls", "200"])
    doc = bench_overhead.collect(args)  # aborts if a view_copy or gather result is wrong
    _check_doc(doc, "overhead")
    shim, copy = doc["rows"]
    assert all(ns > 0 for ns in shim["extra"]["ns_per_call"].values())
    assert set(copy["extra"]["bandwidth_ratio"]) == {
        "view_copy_contiguous",
        "view_copy_channels_last",
        "gather_chunk",
    }


def test_overhead_view_copy_check_catches_a_wrong_kernel(monkeypatch):
    import etmetal.runtime.kernels.view_copy as vc

    # memory order instead of logical order: what a memcpy kernel does to channels-last
    monkeypatch.setattr(
        vc, "view_copy", lambda s, size, out: out.copy_(s.permute(0, 2, 3, 1).reshape(size))
    )
    args = _args(bench_overhead, ["--sizes-mib", "0.25", "--repeat", "1", "--calls", "100"])
    with pytest.raises(SystemExit, match="view_copy result differs"):
        bench_overhead.collect(args)


def test_lowering_suite_cold_then_cached(tmp_path):
    args = _args(
        bench_lowering,
        ["--model", "tiny", "--repeat", "1", "--cached-runs", "2", "--no-pte"],
    )
    doc = bench_lowering.collect(args)
    _check_doc(doc, "lowering")
    (row,) = doc["rows"]
    assert row["samples"] == {"cold": 1, "cached": 2}


def test_all_writes_markdown_from_the_json(tmp_path):
    proc = _run_cli(
        ["all", "--quick", "--suites", "overhead", "--write-md", "B.md", "--json", "all.json"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "all.json").read_text())
    md = (tmp_path / "B.md").read_text()
    assert md == bench_report.render(result)
    assert "etmetal bench overhead" in md and f"torch {torch.__version__}" in md
    ns = result["suites"]["overhead"]["rows"][0]["extra"]["ns_per_call"]["get_data_ptr"]
    assert f"| get_data_ptr | {ns:.0f} |" in md


def test_all_update_md_adds_the_import_times(tmp_path):
    old = "# etmetal benchmarks\n\n## Other suite\n\nkept 1.0 us\n"
    (tmp_path / "B.md").write_text(old)
    proc = _run_cli(
        ["all", "--quick", "--suites", "imports", "--update-md", "B.md", "--json", "all.json"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "all.json").read_text())
    wall, cpu = result["suites"]["imports"]["rows"]
    assert set(wall["median_us"]) == {
        "torch",
        "etmetal.runtime",
        "etmetal.shims",
        "executorch.runtime",
    }
    md = (tmp_path / "B.md").read_text()
    assert md.startswith(old) and "## Import time in a fresh interpreter" in md
    runtime_s = wall["median_us"]["etmetal.runtime"] / 1e6
    assert f"| etmetal.runtime | {runtime_s:.2f} s |" in md
    assert "`etmetal bench imports --json OUT.json --runs 1`" in md
