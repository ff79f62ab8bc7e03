"""``etmetal run --native``: the program runs in ``etmetal_runner`` (ExecuTorch's C++ runtime,
etmetal's native MetalBackend), the trust flags reach it, its printed outputs are eager's, and
``--etdump`` writes an ETDump the Inspector reads."""

from __future__ import annotations

import re

import pytest
import torch

import etmetal
from etmetal.scripts.cli import main


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(x)) * 2


@pytest.fixture(scope="module")
def head_program(tmp_path_factory):
    torch.manual_seed(0)
    model = Head().eval()
    x = torch.randn(4, 12)
    program, _ = etmetal.lower(model, (x,), target="host")
    directory = tmp_path_factory.mktemp("run-native")
    (directory / "head.pte").write_bytes(program.buffer)
    torch.save(x, directory / "x.pt")
    return model, x, directory


def _stats(out: str) -> tuple[float, float, float]:
    m = re.search(r"output 0: torch.float32 \[4, 6\]  min (\S+)  max (\S+)  mean (\S+)", out)
    assert m, out
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def test_native_run_prints_eagers_outputs_and_writes_an_etdump(head_program, capsys):
    model, x, directory = head_program
    etdump = directory / "run.etdp"
    args = ["run", str(directory / "head.pte"), "--native", "--inputs", str(directory / "x.pt")]
    assert main([*args, "--trust-native-code", "--runs", "2", "--etdump", str(etdump)]) == 0
    out = capsys.readouterr().out
    assert "etmetal_runner: " in out and "2 iteration(s)" in out
    with torch.no_grad():
        want = model(x)
    got = _stats(out)
    expected = (want.min().item(), want.max().item(), want.mean().item())
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-5)

    from executorch.devtools import Inspector

    names = {e.name for b in Inspector(etdump_path=str(etdump)).event_blocks for e in b.events}
    assert "MetalBackend.execute" in names


def test_native_run_refuses_untrusted_code_and_accepts_its_digest(head_program, capsys):
    _, _, directory = head_program
    args = ["run", str(directory / "head.pte"), "--native", "--runs", "1"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "load_method failed" in err and "ETMETAL_TRUST_NATIVE_CODE=1" in err
    digest = re.search(r"ETMETAL_TRUSTED_BLOBS=([0-9a-f]{64})", err).group(1)
    assert main([*args, "--trust-hash", digest]) == 0
    out = capsys.readouterr().out
    assert "generated inputs (seed 0)" in out and "output 0: torch.float32 [4, 6]" in out


def test_native_only_options_are_refused_elsewhere(head_program, capsys):
    _, _, directory = head_program
    pte = str(directory / "head.pte")
    assert main(["run", pte, "--etdump", str(directory / "x.etdp")]) == 2
    assert "--etdump needs --native" in capsys.readouterr().err
    assert main(["run", pte, "--native", "--isolate"]) == 2
    assert "--isolate does not apply to --native" in capsys.readouterr().err
