"""``etmetal run`` on a delegated ``.pte``: refused without a trust opt-in, with the reason
and the remedies; run with ``--trust-native-code`` or the environment variable, on given
inputs matching eager."""

from __future__ import annotations

import pytest
import torch

from etmetal.examples.metal_registry import get_model_and_inputs
from etmetal.runtime import metal_delegate
from etmetal.scripts.cli import main


@pytest.fixture
def pte_path(lowered, tmp_path, monkeypatch):
    monkeypatch.delenv(metal_delegate.TRUST_ENV, raising=False)
    monkeypatch.delenv(metal_delegate.TRUSTED_BLOBS_ENV, raising=False)
    low = lowered("registry:linear_bias", lambda: get_model_and_inputs("linear_bias"))
    path = tmp_path / "linear_bias.pte"
    path.write_bytes(low.pte)
    return low, path


def test_run_refuses_native_code_without_opt_in(pte_path, capsys):
    _, path = pte_path
    assert main(["run", str(path), "--runs", "1"]) == 1
    err = capsys.readouterr().err
    assert (
        "native code" in err and "--trust-native-code" in err and "ETMETAL_TRUST_NATIVE_CODE" in err
    )


@pytest.mark.parametrize("how", ["flag", "env"])
def test_run_executes_a_delegated_program(how, pte_path, tmp_path, monkeypatch, capsys):
    low, path = pte_path
    x = torch.randn(127, 7)
    torch.save(x, tmp_path / "x.pt")
    argv = ["run", str(path), "--inputs", str(tmp_path / "x.pt"), "--runs", "3"]
    if how == "flag":
        argv.append("--trust-native-code")
    else:
        monkeypatch.setenv(metal_delegate.TRUST_ENV, "1")
    assert main(argv) == 0
    out = capsys.readouterr().out
    expected = low.module(x).detach()
    assert "output 0: torch.float32 [127, 101]" in out
    assert f"max {expected.max().item():.6g}" in out and "latency" in out
