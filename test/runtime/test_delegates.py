"""Delegates: found by backend id, ``init`` once at load, ``execute`` per call, ``destroy``.

The delegate under test is ExecuTorch's own demo ``ExecutorBackend`` (its processed bytes
are a whole nested ``.pte``); the executor here runs that nested program with etmetal's
runtime, so the delegated program's outputs can be checked against eager.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from etmetal.runtime import (
    BackendExecutor,
    MissingDelegateError,
    Runtime,
    lookup_delegate,
    register_delegate,
)
from etmetal.runtime import delegates as delegate_registry

EVENTS: list[tuple[str, object]] = []


class NestedProgramExecutor(BackendExecutor):
    @classmethod
    def init(cls, context, processed, compile_specs):
        self = cls()
        self.method = Runtime.get().load_program(processed).load_method("forward")
        self.n_in = self.method.metadata.num_inputs()
        EVENTS.append(("init", context.method_name))
        return self

    def execute(self, args):
        EVENTS.append(("execute", len(args)))
        outputs = self.method.execute(args[: self.n_in])
        for out, value in zip(args[self.n_in :], outputs):
            out.resize_(value.shape)
            out.copy_(value)

    def destroy(self):
        EVENTS.append(("destroy", None))
        self.method.destroy()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)

    def forward(self, x, y):
        return (self.lin(x) * y).sigmoid()


@pytest.fixture(scope="module")
def delegated_pte(lower):
    from executorch.exir.backend.test.demos.rpc.executor_backend_partitioner import (
        ExecutorBackendPartitioner,
    )

    return lower(
        Model(), (torch.randn(2, 5), torch.randn(2, 3)), partitioner=[ExecutorBackendPartitioner()]
    )


@pytest.fixture
def registered():
    before = dict(delegate_registry._delegates)
    register_delegate("ExecutorBackend", NestedProgramExecutor)
    EVENTS.clear()
    yield
    delegate_registry._delegates.clear()
    delegate_registry._delegates.update(before)


def test_missing_delegate_is_a_load_error_naming_the_backend(delegated_pte):
    assert lookup_delegate("ExecutorBackend") is None
    program = Runtime.get().load_program(delegated_pte)
    # metadata is read from the program: no delegate is needed (or initialized) for it
    meta = program.metadata("forward")
    assert meta.uses_backend("ExecutorBackend") and meta.num_inputs() == 2
    with pytest.raises(MissingDelegateError, match="ExecutorBackend"):
        program.load_method("forward")


def test_delegate_runs_and_is_initialized_once(lower, registered):
    from executorch.exir.backend.test.demos.rpc.executor_backend_partitioner import (
        ExecutorBackendPartitioner,
    )

    model = Model().eval()
    x, y = torch.randn(2, 5), torch.randn(2, 3)
    pte = lower(model, (x, y), partitioner=[ExecutorBackendPartitioner()])
    method = Runtime.get().load_program(pte).load_method("forward")
    assert method.metadata.uses_backend("ExecutorBackend")
    assert EVENTS == [("init", "forward")]
    for _ in range(3):
        xi, yi = torch.randn(2, 5), torch.randn(2, 3)
        torch.testing.assert_close(method.execute([xi, yi])[0], model(xi, yi))
    assert [e for e, _ in EVENTS].count("execute") == 3
    assert all(n >= 3 for e, n in EVENTS if e == "execute")  # inputs and outputs
    method.destroy()
    assert EVENTS[-1] == ("destroy", None)
    method.destroy()  # idempotent
    assert [e for e, _ in EVENTS].count("destroy") == 1


def test_entry_points_register_kernels_and_delegates(tmp_path):
    """A third-party package plugs in through both entry-point groups (run in a fresh
    interpreter so the registries start empty)."""
    (tmp_path / "fake_plugin.py").write_text(
        textwrap.dedent(
            """
            import torch
            from etmetal.runtime import BackendExecutor

            def relu_that_adds_one(self, out):
                out.copy_(torch.relu(self) + 1)

            class Echo(BackendExecutor):
                @classmethod
                def init(cls, context, processed, compile_specs):
                    return cls()

                def execute(self, args):
                    pass
            """
        )
    )
    dist = tmp_path / "fake_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[executorch.runtime.kernels]\naten::relu.out = fake_plugin:relu_that_adds_one\n\n"
        "[executorch.runtime.delegates]\nEchoBackend = fake_plugin:Echo\n"
    )
    script = textwrap.dedent(
        """
        import torch
        from etmetal.runtime import lookup_delegate
        from etmetal.runtime.kernels import lookup
        kernel = lookup("aten::relu.out")
        out = torch.empty(3)
        kernel(torch.tensor([-1.0, 0.0, 2.0]), out)
        print(out.tolist(), lookup_delegate("EchoBackend").__name__)
        print(lookup("aten::add.out") is not None, lookup("nonexistent::op.out"))
        """
    )
    env_path = f"{tmp_path}:{':'.join(sys.path)}"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={"PYTHONPATH": env_path}
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-2] == "[1.0, 1.0, 3.0] Echo"  # the plugin overrode the built-in relu
    assert lines[-1] == "True None"
