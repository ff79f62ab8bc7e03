"""``etmetal bench imports``: fresh interpreters, the JSON rows, the markdown section, and a
clear error for a module that does not import. No time is asserted."""

from __future__ import annotations

import sys

import pytest

from etmetal.bench import imports, report


def test_each_sample_is_a_fresh_interpreter(tmp_path, monkeypatch):
    # a module that counts its imports in a file: one line per interpreter that ran it
    (tmp_path / "counted.py").write_text(
        f"with open({str(tmp_path / 'log')!r}, 'a') as f:\n    f.write('x\\n')\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    rows = imports.measure(["counted", "json"], runs=3)
    assert (tmp_path / "log").read_text() == "x\n" * 3
    wall, cpu = rows
    assert (wall.case, cpu.case) == ("wall", "cpu")
    for row in rows:
        assert set(row.timings) == {"counted", "json"}
        assert all(t.samples == 3 and t.median_s > 0 for t in row.timings.values())
        assert row.ratios == {}  # no torch arm, no ratio to it


def test_ratio_and_target_when_torch_and_the_runtime_are_measured():
    wall, cpu = imports.measure(["torch", "etmetal.runtime"], runs=1)
    for row in (wall, cpu):
        r = row.ratios["etmetal.runtime/torch"]
        assert r == pytest.approx(
            row.timings["etmetal.runtime"].median_s / row.timings["torch"].median_s
        )
        limit = row.extra["target_s_at_most"]["etmetal.runtime"]
        met = row.timings["etmetal.runtime"].median_s < limit
        assert row.extra["met_s"] == {"etmetal.runtime": met}
    doc = {"rows": [wall.to_json(), cpu.to_json()], "wall_s": 1.0}
    lines = report._section("imports", doc, "etmetal bench imports")
    line = next(x for x in lines if x.startswith("| etmetal.runtime |"))
    assert f"| {wall.timings['etmetal.runtime'].median_s:.2f} s |" in line
    assert f"| {cpu.timings['etmetal.runtime'].median_s:.2f} s |" in line


def test_a_module_that_fails_to_import_is_named():
    with pytest.raises(SystemExit, match=r"'import etmetal_no_such_module' failed.*ModuleNotFound"):
        imports.time_import("etmetal_no_such_module")
