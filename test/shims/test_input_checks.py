"""A compiled model checks its inputs because etmetal compiled the check in, not because
anything wrote the process environment: the first run leaves ``os.environ`` as it was,
and a user's ``AOTI_RUNTIME_CHECK_INPUTS=0`` cannot switch the check off."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import etmetal
from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.backend.input_checks import ENV_SWITCH
from etmetal.shims import AotiModel
from etmetal.shims.model import AotiModelError

PACKAGE = Path(etmetal.__file__).parent


class ScaledShift(nn.Module):
    """A model no other test compiles: its first run in this process is this test's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 0.75 - 0.125)


def test_first_run_checks_inputs_without_writing_the_environment(monkeypatch):
    x = torch.randn(3, 5)
    art = compile_exported_program(torch.export.export(ScaledShift(), (x,)))
    assert art.wrapper_cpp_path is not None
    assert ENV_SWITCH not in art.wrapper_cpp_path.read_text()
    # with the environment asking for no checks, a .so that read it would skip them
    monkeypatch.setenv("AOTI_RUNTIME_CHECK_INPUTS", "0")
    before = dict(os.environ)
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        with pytest.raises(AotiModelError, match="unmatched dim value"):
            model.run([torch.randn(3, 4)])  # the first run: a short input is refused
        assert dict(os.environ) == before
        torch.testing.assert_close(model.run([x])[0], ScaledShift()(x))
        with pytest.raises(AotiModelError, match="unmatched dtype"):
            model.run([x.double()])  # and on later (steady) runs too
    assert dict(os.environ) == before


def _environment_writes(path: Path) -> list[str]:
    """``os.environ[...] = ``, ``del os.environ[...]``, ``os.environ.pop/update/...``,
    ``os.putenv``/``os.unsetenv`` in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if hasattr(node, "targets") else [node.target]
        for t in targets:
            if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ":
                found.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            mutators = ("pop", "popitem", "update", "setdefault", "clear", "__setitem__")
            if name in ("os.putenv", "os.unsetenv") or name in {
                f"os.environ.{m}" for m in mutators
            }:
                found.append(f"{path.name}:{node.lineno}")
    return found


@pytest.mark.parametrize("package", ["shims", "runtime"])
def test_no_environment_writes_at_run_time(package):
    sources = sorted((PACKAGE / package).resolve().rglob("*.py"))
    assert sources
    writes = [w for path in sources for w in _environment_writes(path)]
    assert writes == []


def test_the_environment_scan_finds_a_write(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nos.environ['A'] = '1'\nos.environ.pop('A')\nos.putenv('B', 'x')\n")
    assert _environment_writes(bad) == ["bad.py:2", "bad.py:3", "bad.py:4"]
