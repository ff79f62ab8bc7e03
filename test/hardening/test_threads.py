"""Thread safety: one ``Method`` executed from several threads, and concurrent delegates.

Executes of one method are serialized (its planned memory is per method), so each
thread gets the outputs of its own inputs; a re-entrant execute is refused. Two
methods with different Metal delegates run concurrently through the shared shim
layer and each matches eager.
"""

from __future__ import annotations

import threading

import pytest
import torch

from etmetal.runtime import BackendExecutor, ExecutionError, Runtime
from etmetal.runtime import delegates as delegate_registry
from etmetal.shims import memory_stats

THREADS = 4
ROUNDS = 25


def _run_threads(target, n: int) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _inputs(demo, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in demo.inputs:
        fmt = (
            torch.channels_last if t.dim() == 4 and t.stride()[1] == 1 else torch.contiguous_format
        )
        out.append(torch.randn(t.shape, generator=g).to(memory_format=fmt))
    return out


@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "isolated"])
def test_one_method_from_several_threads_gives_each_its_own_outputs(demos, isolate):
    demo = demos["transformer_block"]
    program = Runtime.get().load_program(demo.pte, trust_native_code=True, isolate=isolate)
    method = program.load_method("forward")
    expected = {}
    for i in range(THREADS):
        with torch.no_grad():
            expected[i] = demo.module(*_inputs(demo, i))

    def work(i):
        inputs = _inputs(demo, i)
        for _ in range(ROUNDS):
            out = method.execute(inputs)[0]
            torch.testing.assert_close(out, expected[i], atol=1e-4, rtol=1e-4)

    assert _run_threads(work, THREADS) == []
    method.destroy()


def test_concurrent_delegates_share_the_shim_layer_safely(demos):
    methods = {
        name: Runtime.get().load_program(d.pte, trust_native_code=True).load_method("forward")
        for name, d in demos.items()
    }
    names = sorted(methods)
    before = memory_stats()

    def work(i):
        name = names[i % len(names)]
        demo = demos[name]
        inputs = _inputs(demo, 100 + i)
        with torch.no_grad():
            want = demo.module(*inputs)
        for _ in range(ROUNDS):
            torch.testing.assert_close(methods[name].execute(inputs)[0], want, atol=1e-4, rtol=1e-4)

    assert _run_threads(work, THREADS) == []
    assert memory_stats().storages == before.storages
    for m in methods.values():
        m.destroy()


class _Reentrant(BackendExecutor):
    """A delegate that calls back into the method that is running it."""

    method = None

    @classmethod
    def init(cls, context, processed, compile_specs):
        return cls()

    def execute(self, args):
        _Reentrant.method.execute([args[0]])


def test_reentrant_execute_is_refused_with_a_clear_error(crash_artifacts):
    _, pte = crash_artifacts
    before = dict(delegate_registry._delegates)
    delegate_registry.register_delegate("CrashBackend", _Reentrant)
    try:
        method = Runtime.get().load_program(pte).load_method("forward")
        _Reentrant.method = method
        with pytest.raises(ExecutionError, match="already executing on this thread"):
            method.execute([torch.randn(4, 3)])
    finally:
        delegate_registry._delegates.clear()
        delegate_registry._delegates.update(before)
        _Reentrant.method = None
