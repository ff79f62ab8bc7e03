"""``etmetal regress cortex-m`` end to end: zoo programs lowered by ExecuTorch's Cortex-M flow,
run in etmetal's runtime, compared with the flow's own reference (within the upstream
``qtol``) and with the Cortex-M dialect program on ExecuTorch's Python kernels (exactly).

Lowered programs are cached by content under the user cache dir, so only a cold
cache pays for the lowering (a few seconds per case). Needs the ``cortex-m`` extra
(``tosa-tools``: ExecuTorch's Cortex-M tester imports the Arm TOSA serializer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from etmetal.examples.cortex_m_zoo import zoo
from etmetal.testing.cortex_m_check import run_case

# the MLPerf Tiny models that lower in seconds, and module cases reaching the operators
# they do not: softmax, max pooling, mul, minimum (hardswish), transposed convolution,
# and a program mixing a portable aten kernel (hardtanh) with cortex_m ones
CASES = ["deep_autoencoder", "ds_cnn", "resnet8", "softmax", "max_pool2d", "mul_add",
         "hardswish", "conv_transpose2d", "conv_relu6_avgpool"]  # fmt: skip


def _etmetal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


@pytest.mark.parametrize("name", CASES)
def test_zoo_case_passes_in_etmetal_runtime(name):
    result = run_case(zoo()[name])
    assert result.status == "pass", f"{name}: {result.status}: {result.detail}"
    assert result.max_error <= result.tolerance
    assert result.exact_vs_dialect, f"{name} differs from the cortex_m dialect program"
    assert any(op.startswith("cortex_m::") for op in result.operators)


def test_cli_json_reports_one_model():
    out = _etmetal("regress", "cortex-m", "--models", "deep_autoencoder", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    (row,) = report["results"]
    assert row["model"] == "deep_autoencoder" and row["status"] == "pass"
    assert row["exact_vs_dialect"] is True
    assert "cortex_m::quantized_linear.out" in row["operators"] and row["ops"] == len(
        row["operators"]
    )
    assert row["run_seconds"] is not None and row["max_error"] <= row["tolerance"]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (no second torch import): exit code, stdout, stderr."""
    from etmetal.scripts.cli import main

    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_table_and_unavailable_case(capsys):
    # yolo11n needs ultralytics and downloaded weights: reported with the reason, not failed
    code, out, err = _cli(capsys, "regress", "cortex-m", "--models", "deep_autoencoder,yolo11n")
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["model", "ops", "max"]
    assert any(line.startswith("deep_autoencoder") and " pass " in line for line in lines)
    assert any(line.startswith("yolo11n") and "unavailable" in line for line in lines)
    assert "ultralytics" in out


def test_cli_unknown_model_is_an_error_naming_it(capsys):
    code, _, err = _cli(capsys, "regress", "cortex-m", "--models", "lenet9000")
    assert code != 0
    assert "lenet9000" in err


def test_cli_lists_the_zoo(capsys):
    code, out, err = _cli(capsys, "regress", "cortex-m", "--list")
    assert code == 0, err
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"ds_cnn", "resnet8", "deep_autoencoder", "mobilenet_v2", "mobilenet_v1_025"} <= listed
