"""The runtime reads programs without ``executorch.exir``'s package init, and a later
``import executorch.exir`` still gets the whole package, sharing the schema classes.

Each check runs in a fresh interpreter: in the test process ``executorch.exir`` is
usually imported already, and then :mod:`etmetal.runtime.program_schema` has nothing to
avoid. No timing is asserted; ``etmetal bench imports`` measures the time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
from conftest import to_pte

# the ahead-of-time stack the runtime must not pull in
HEAVY = ("executorch.exir", "torch._dynamo", "torch._inductor", "torchao")

CHILD = textwrap.dedent(
    """
    import sys
    import torch
    import etmetal.runtime
    from etmetal.runtime import Runtime

    HEAVY = {heavy!r}
    pte, inputs, want = sys.argv[1], torch.load(sys.argv[2]), torch.load(sys.argv[3])
    assert [m for m in HEAVY if m in sys.modules] == [], [m for m in HEAVY if m in sys.modules]
    got = Runtime.get().load_program(pte).load_method("forward").execute(list(inputs))
    torch.testing.assert_close(got[0], want)
    assert [m for m in HEAVY if m in sys.modules] == [], "loading a program imported them"

    # now the user's own ahead-of-time code: the real package, its init run in full
    import executorch.exir
    from executorch.exir import to_edge_transform_and_lower
    from etmetal.runtime.program_schema import schema

    assert executorch.exir.schema is schema
    assert executorch.exir.backend.compile_spec_schema.CompileSpec is schema.CompileSpec
    assert executorch.exir._serialize._program.Program is schema.Program

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    x = torch.arange(6.0).reshape(2, 3)
    manager = to_edge_transform_and_lower(torch.export.export(AddOne(), (x,))).to_executorch()
    # one set of schema classes: exir's program is an instance of the runtime's
    assert isinstance(manager.executorch_program, schema.Program)
    out = Runtime.get().load_program(manager.buffer).load_method("forward").execute([x])
    torch.testing.assert_close(out[0], x + 1)
    print("ok")
    """
)


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_runtime_reads_programs_without_exir_init(tmp_path):
    model = _Linear().eval()
    inputs = (torch.randn(2, 4),)
    with torch.no_grad():
        want = model(*inputs)  # eager PyTorch is the reference
    pte = tmp_path / "linear.pte"
    pte.write_bytes(to_pte(model, inputs))
    torch.save(inputs, tmp_path / "inputs.pt")
    torch.save(want, tmp_path / "want.pt")
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(heavy=HEAVY))
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            str(pte),
            str(tmp_path / "inputs.pt"),
            str(tmp_path / "want.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_shims_import_no_export_stack():
    code = f"import sys, etmetal.shims\nprint([m for m in {HEAVY!r} if m in sys.modules])\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


BROKEN = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class Broken(importlib.abc.MetaPathFinder):  # one parser module cannot be imported
        def find_spec(self, name, path=None, target=None):
            if name == "executorch.exir._serialize._program":
                raise ImportError("simulated: the .pte parser is broken")
            return None

    sys.meta_path.insert(0, Broken())
    try:
        import etmetal.runtime
    except ImportError as exc:
        assert "simulated" in str(exc), exc
    else:
        raise AssertionError("import etmetal.runtime succeeded without its parser")
    left = sorted(n for n in sys.modules if n.startswith("executorch.exir"))
    assert left == [], left  # nothing half-imported stays behind
    sys.meta_path.remove(sys.meta_path[0])
    import executorch.exir  # the real package still imports afterwards
    assert executorch.exir.schema.Program is not None
    print("ok")
    """
)


def test_a_failed_schema_import_leaves_nothing_behind(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(BROKEN)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
