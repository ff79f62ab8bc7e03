"""``etmetal regress metal-check``: a model lowered for ``mps_emulated`` runs under the Metal
checker and its row says clean (no fault, outputs equal to eager, checked accesses made);
an unknown model is an error naming it."""

from __future__ import annotations

import json
import subprocess
import sys


def _etmetal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", *args], capture_output=True, text=True
    )


def test_a_model_runs_clean_under_the_checker():
    out = _etmetal("regress", "metal-check", "--model", "add", "--repeats", "1", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    [row] = json.loads(out.stdout[out.stdout.index("[") :])
    assert row["name"] == "add" and row["clean"] and row["matches_eager"]
    assert row["faults"] == [] and row["error"] == ""
    assert row["checked_accesses"] > 0  # add's Metal kernel ran the checked build


def test_an_unknown_model_is_named():
    out = _etmetal("regress", "metal-check", "--model", "no_such_model")
    assert out.returncode == 2
    assert "unknown model 'no_such_model'" in out.stderr and "demo:patch_embedding" in out.stderr
