"""``isolate=True``: delegates in a worker process over shared memory.

A ``.so`` that segfaults in ``Run`` becomes an etmetal error in the host, which keeps
serving (the worker is respawned); isolated outputs equal in-process ones and eager.
"""

from __future__ import annotations

import os

import pytest
import torch
from crash_delegate import FLAG_ENV, HANG_ENV, CrashExecutor

from etmetal.runtime import DelegateError, EtmetalRuntimeError, Runtime
from etmetal.runtime import delegates as delegate_registry
from etmetal.runtime.isolation import IsolationHost


@pytest.fixture
def crash_registered(monkeypatch, tmp_path):
    before = dict(delegate_registry._delegates)
    delegate_registry.register_delegate("CrashBackend", CrashExecutor)
    flag = tmp_path / "crash-now"
    monkeypatch.setenv(FLAG_ENV, str(flag))
    yield flag
    delegate_registry._delegates.clear()
    delegate_registry._delegates.update(before)


def test_segfaulting_so_is_an_error_and_the_host_keeps_serving(
    crash_artifacts, crash_registered, demos
):
    _, pte = crash_artifacts
    flag = crash_registered
    x = torch.randn(4, 3)
    method = Runtime.get().load_program(pte, isolate=True).load_method("forward")
    assert torch.equal(method.execute([x])[0], x)  # the identity .so, healthy
    first_pid = method.isolation.worker_pid

    flag.touch()  # Run now dereferences NULL
    with pytest.raises(EtmetalRuntimeError, match="SIGSEGV") as info:
        method.execute([x])
    assert isinstance(info.value.__cause__, DelegateError)
    with pytest.raises(EtmetalRuntimeError, match="SIGSEGV"):  # respawned, crashes again
        method.execute([x])
    flag.unlink()

    # the same method recovers in a new worker; planned memory stayed in the host
    y = torch.randn(4, 3)
    assert torch.equal(method.execute([y])[0], y)
    assert method.isolation.worker_pid not in (None, first_pid)
    assert method.isolation.spawns == 3  # at load, after each of the two crashes

    # and this process still runs other programs, isolated and not
    demo = demos["patch_embedding"]
    for isolate in (False, True):
        program = Runtime.get().load_program(demo.pte, trust_native_code=True, isolate=isolate)
        out = program.load_method("forward").execute(demo.inputs)[0]
        torch.testing.assert_close(out, demo.expected, atol=1e-4, rtol=1e-4)
    method.destroy()


def test_hanging_delegate_times_out_and_the_method_recovers(
    crash_artifacts, crash_registered, monkeypatch, tmp_path
):
    _, pte = crash_artifacts
    hang = tmp_path / "hang-now"
    monkeypatch.setenv(HANG_ENV, str(hang))
    monkeypatch.setenv("ETMETAL_ISOLATE_TIMEOUT", "3")
    x = torch.randn(4, 3)
    method = Runtime.get().load_program(pte, isolate=True).load_method("forward")
    hang.touch()
    with pytest.raises(EtmetalRuntimeError, match=r"did not finish execute within 3.0 s"):
        method.execute([x])
    hang.unlink()
    assert torch.equal(method.execute([x])[0], x)
    method.destroy()


@pytest.mark.parametrize("name", ["transformer_block", "patch_embedding"])
def test_isolated_outputs_equal_in_process_and_eager(demos, name):
    demo = demos[name]
    runtime = Runtime.get()
    local = runtime.load_program(demo.pte, trust_native_code=True).load_method("forward")
    isolated = runtime.load_program(demo.pte, trust_native_code=True, isolate=True)
    method = isolated.load_method("forward")
    host = method.isolation
    assert isinstance(host, IsolationHost)
    # planned memory is shared: every delegate argument is passed by reference, no copy
    assert host.arenas and all(a.fd >= 0 for a in host.arenas)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        inputs = [
            torch.randn(t.shape, generator=g).to(memory_format=_format(t)) for t in demo.inputs
        ]
        got = method.execute(inputs)[0]
        assert torch.equal(got, local.execute(inputs)[0])
        with torch.no_grad():
            torch.testing.assert_close(got, demo.module(*inputs), atol=1e-4, rtol=1e-4)
    pid = host.worker_pid
    method.destroy()
    local.destroy()
    with pytest.raises(ProcessLookupError):  # the worker was shut down and reaped
        os.kill(pid, 0)


def _format(t: torch.Tensor):
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def test_untrusted_native_code_is_refused_in_the_worker_too(demos):
    demo = demos["patch_embedding"]
    program = Runtime.get().load_program(demo.pte, isolate=True)
    with pytest.raises(DelegateError, match="native code"):
        program.load_method("forward")


def test_cli_run_isolate(demos, tmp_path, capsys):
    from etmetal.scripts.cli import main

    path = tmp_path / "patch_embedding.pte"
    path.write_bytes(demos["patch_embedding"].pte)
    assert main(["run", str(path), "--isolate", "--trust-native-code", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "output 0: torch.float32 [2, 64, 48]" in out


class _DynamicBatch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)

    def forward(self, x):
        return torch.cat([self.lin(x).relu(), x[:, :2]], dim=-1)


def test_isolated_dynamic_output_shapes_follow_the_inputs():
    from etmetal.backend.lowering import lower

    module = _DynamicBatch().eval()
    batch = torch.export.Dim("batch", min=2, max=8)
    program, _ = lower(module, (torch.randn(8, 6),), target="host", dynamic_shapes=({0: batch},))
    method = (
        Runtime.get()
        .load_program(program.buffer, trust_native_code=True, isolate=True)
        .load_method("forward")
    )
    for n in (8, 3, 5, 2):
        x = torch.randn(n, 6)
        out = method.execute([x])[0]
        with torch.no_grad():
            torch.testing.assert_close(out, module(x), atol=1e-5, rtol=1e-5)
    method.destroy()


def test_killed_worker_leaves_no_so_directory_behind(demos):
    import signal
    import tempfile
    from pathlib import Path

    demo = demos["patch_embedding"]
    program = Runtime.get().load_program(demo.pte, trust_native_code=True, isolate=True)
    method = program.load_method("forward")
    method.execute(demo.inputs)
    pid = method.isolation.worker_pid
    tmp = Path(tempfile.gettempdir())
    assert list(tmp.glob(f"etmetal-delegate-{pid}-*"))  # the worker's private .so directory
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EtmetalRuntimeError, match="SIGKILL"):
        method.execute(demo.inputs)
    assert not list(tmp.glob(f"etmetal-delegate-{pid}-*"))  # swept: its owner is dead
    out = method.execute(demo.inputs)[0]
    torch.testing.assert_close(out, demo.expected, atol=1e-4, rtol=1e-4)
    method.destroy()
