"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in a fresh interpreter (so a block that depends on an import done by some
other test, such as torchao's low-bit ops being registered, fails here as it would for a
user), in a scratch directory (blocks may write ``model.pte``). The README names two
placeholders a block may use without defining them, and this test provides them:

- ``model``: a small ``nn.Module`` (two linears around a ReLU; the linears' input widths
  are multiples of 32, so the int4 block's ``group_size=32`` applies);
- ``example_inputs``: a tuple with one input for it.

After a block, what it leaves behind is checked against eager PyTorch: ``outputs`` (a
program's results) must match the eager ``model`` on ``example_inputs``, and a ``model``
the block changed in place (quantized) must still run on them and stay close to eager.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\S*)\s*$")


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, source) of each ```python block of ``path``."""
    blocks, lang, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = _FENCE.match(line)
        if fence and lang is None:
            lang, start, lines = fence.group(1) or "text", number + 1, []
        elif fence and line.strip() == "```":
            if lang == "python":
                blocks.append((start, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, f"{path.name}: a code block opened on line {start - 1} never closes"
    return blocks


BLOCKS = [
    pytest.param(path, start, source, id=f"{path.relative_to(ROOT)}:{start}")
    for path in DOCS
    for start, source in python_blocks(path)
]

# the placeholders, then the block exactly as written, then the checks; the block's own
# names are the script's globals, as they would be in a user's script
_PRELUDE = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)
).eval()
example_inputs = (torch.randn(4, 64),)
with torch.no_grad():
    _reference = model(*example_inputs)
_placeholder_model = model
"""
_CHECKS = """
import json as _json
_checks = []
if "outputs" in globals():
    torch.testing.assert_close(outputs[0], _reference, rtol=1e-4, atol=1e-5)
    _checks.append("outputs == eager")
if model is _placeholder_model:
    with torch.no_grad():
        _now = model(*example_inputs)
    _err = ((_now - _reference).norm() / _reference.norm()).item()
    assert _err < 0.25, f"model after the block is {_err:.3f} off eager (relative)"
    _checks.append(f"model runs, {_err:.4f} off eager")
print("DOC-CHECKS " + _json.dumps(_checks))
"""


def test_the_docs_have_python_blocks():
    # the README's three examples (run, shared weights, int4) at least
    assert sum(param.values[0].name == "README.md" for param in BLOCKS) >= 3


def test_fence_reader_finds_blocks(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("a\n```python\nx = 1\n```\n```sh\nls\n```\n```python\ny = 2\nz = 3\n```\n")
    assert python_blocks(doc) == [(3, "x = 1\n"), (9, "y = 2\nz = 3\n")]


@pytest.mark.parametrize(("doc", "start", "source"), BLOCKS)
def test_doc_block_runs_as_written(doc: Path, start: int, source: str, tmp_path):
    name = str(doc.relative_to(ROOT))
    # blank lines before the block keep its line numbers the document's in a traceback
    (tmp_path / "block.txt").write_text("\n" * (start - 1) + source)
    run_block = f"exec(compile(open('block.txt').read(), {name!r}, 'exec'))\n"
    script = tmp_path / "run_block.py"
    script.write_text(textwrap.dedent(_PRELUDE) + run_block + textwrap.dedent(_CHECKS))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    where = f"{name} block at line {start}"
    assert proc.returncode == 0, f"{where} failed:\n{proc.stderr[-4000:]}"
    marker = [line for line in proc.stdout.splitlines() if line.startswith("DOC-CHECKS ")]
    assert marker, f"{where}: the checks after the block did not run:\n{proc.stdout[-2000:]}"
    print(where, json.loads(marker[-1].split(" ", 1)[1]))


_CITED = re.compile(r"(?<![\w/.])(test/[\w/]+\.py)(?:::(\w+))?")


def test_every_test_the_docs_cite_exists():
    """A claim cites the test that shows it (``test/x.py::test_y``, or a whole file); the
    file must exist and define that test, so a renamed or deleted test breaks the doc here."""
    import ast

    missing = []
    cited = 0
    for doc in DOCS:
        for path, name in _CITED.findall(doc.read_text()):
            cited += 1
            target = ROOT / path
            if not target.is_file():
                missing.append(f"{doc.name}: {path}")
                continue
            if name:
                tree = ast.parse(target.read_text())
                defined = {
                    n.name
                    for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                }
                if name not in defined:
                    missing.append(f"{doc.name}: {path}::{name}")
    assert cited >= 20  # docs/architecture.md cites its evidence
    assert missing == []
