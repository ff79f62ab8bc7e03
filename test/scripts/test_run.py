"""``etmetal run`` as a new user meets it: random inputs an LM-style program accepts (token
ids in range, so an embedding does not index out of bounds), results matching eager PyTorch,
a line saying where the program's work runs, and ``--help`` saying how inputs are drawn."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import etmetal
from etmetal.runtime import Runtime
from etmetal.scripts import run as run_command
from etmetal.scripts.cli import main


class TinyLM(torch.nn.Module):
    """A language model's front and back: token ids -> embedding -> logits."""

    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(tokens)))


def _stats(line: str) -> tuple[float, float, float]:
    m = re.search(r"min (\S+)  max (\S+)  mean (\S+)", line)
    assert m, line
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def _line(out: str, start: str) -> str:
    found = [line for line in out.splitlines() if line.lstrip().startswith(start)]
    assert found, f"no line starting {start!r} in:\n{out}"
    return found[0]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    model = TinyLM().eval()
    program, partitioner = etmetal.lower(
        model, (torch.tensor([[1, 5, 2, 7, 0, 3]]),), target="host"
    )
    path = tmp_path_factory.mktemp("run") / "lm.pte"
    path.write_bytes(program.buffer)
    return model, path, partitioner


def test_random_token_ids_are_valid_indices_and_results_match_eager(tiny_lm, capsys):
    model, path, partitioner = tiny_lm
    assert main(["run", str(path), "--trust-native-code", "--runs", "1", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    inputs_line = _line(out, "random inputs (seed 3)")
    assert "torch.int64 [1, 6]" in inputs_line
    lowest, highest, _ = _stats(inputs_line)
    # small and non-negative: in range for the 16-row embedding (and any table of >= 8 rows)
    assert lowest >= 0 and highest < 8
    # the same inputs, rebuilt from the seed, through eager PyTorch
    meta = Runtime.get().load_program(path, trust_native_code=True).metadata("forward")
    tokens = run_command.random_input(meta.input_specs[0], torch.Generator().manual_seed(3))
    assert tokens.dtype == torch.int64 and int(tokens.min()) >= 0 and int(tokens.max()) < 8
    with torch.no_grad():
        expected = model(tokens)
    want = (expected.min().item(), expected.max().item(), expected.mean().item())
    assert _stats(_line(out, "output 0:")) == pytest.approx(want, rel=1e-4, abs=1e-5)
    # where the work ran: one delegate call per partition the partitioner made
    calls = len(partitioner.report.partitions)
    assert calls >= 1
    summary = _line(out, "method 'forward':")
    assert f"{calls} delegate call(s) (MetalBackend x{calls}, target host)" in summary


def test_run_help_says_how_random_inputs_are_drawn():
    out = subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", "run", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "integers (token ids, positions, indices) in [0, 8)" in text
