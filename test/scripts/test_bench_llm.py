"""Smoke test of ``etmetal bench llm`` at the tiny LM size: the JSON structure, that every
arm computed what eager does, and the memory table for both layouts. Timings are
reported by the suite, never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_bench_llm_reports_latency_and_memory_for_both_layouts(tmp_path, tiny_lm_programs):
    # the programs the bench lowers (its lower_programs), shared with test/delegate/test_llm
    from etmetal.bench.llm import program_paths

    lowered = {p: p.stat().st_mtime_ns for p in program_paths("tiny", tiny_lm_programs).values()}
    md = tmp_path / "BENCH.md"
    md.write_text("# benchmarks\n\nkept\n")
    argv = ["--config", "tiny", "--repeat", "2", "--json", "out.json", "--write-md", str(md)]
    argv += ["--programs", str(tiny_lm_programs)]
    proc = subprocess.run(
        [sys.executable, "-m", "etmetal.scripts.cli", "bench", "llm", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "ETMETAL_PROGRESS": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in lowered} == lowered  # reused, not lowered again
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["suite"] == "llm"
    assert [r["case"] for r in doc["rows"]] == ["prefill", "decode"]
    for row in doc["rows"]:
        assert set(row["median_us"]) == {"eager", "etmetal", "torch_aoti"}
        errs = row["extra"]["max_abs_err_vs_eager"]
        assert set(errs) == {"etmetal", "torch_aoti"} and max(errs.values()) < 1e-3
        for name, ratio in row["ratios"].items():
            num, den = name.split("/")
            assert ratio == pytest.approx(row["median_us"][num] / row["median_us"][den])
    assert set(doc["memory"]) == {"shared", "one_blob"}
    for m in doc["memory"].values():
        assert m["pte_mib"] > 0
        assert m["both_methods"]["peak_mib"] >= m["both_methods"]["above_base_mib"] > 0
        ratio = m["both_methods"]["peak_mib"] / m["one_method"]["peak_mib"]
        assert m["both_over_one"] == pytest.approx(ratio)
    text = md.read_text()
    assert text.startswith("# benchmarks\n\nkept\n") and text.count("## LLM") == 1
    assert "| decode |" in text and "| shared |" in text and "| one_blob |" in text
