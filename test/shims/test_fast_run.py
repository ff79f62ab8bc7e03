"""``AotiModel.run`` as one CPython call (``shims/fast_run.py``): the same results as the
Python path and eager, the Python path's errors for anything unusual, nothing leaked."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref

import pytest
import torch
from torch import nn

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.shims import AotiModel, memory_stats
from etmetal.shims.model_run import AotiModelError
from etmetal.testing.resident import resident_bytes

MIB = 1 << 20


class Small(nn.Module):
    """Two small outputs, one through a fallback (mm): both copied out in C."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(16, 8))

    def forward(self, x: torch.Tensor):
        return torch.relu(x * 2 + 1), x @ self.w


def _x(seed: int, shape=(4, 16), dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.fixture(scope="module")
def art():
    module = Small().eval()
    return module, compile_exported_program(torch.export.export(module, (_x(0),)))


@pytest.fixture
def model(art):
    with AotiModel(art[1].so_path, art[1].weights_path.read_bytes()) as m:
        yield m


def _python_path(model, *args):
    """The Python path the fast run stands in front of (its fallback)."""
    return AotiModel._run_general(model, *args)


def _error(fn, *args) -> str:
    with pytest.raises(Exception) as info:
        fn(*args)
    return f"{type(info.value).__name__}: {info.value}"


def test_runs_in_c_with_the_python_paths_bits_and_independent_results(art, model):
    module = art[0]
    fast = model._fast_call
    assert type(fast).__name__ == "FastRun"
    model.run([_x(0)])  # the first run teaches the outputs (Python path)
    before = fast.stats()
    kept = []
    for seed in range(8):
        x = _x(seed)
        got, ref = model.run([x]), _python_path(model, [x])
        for g, r in zip(got, ref):
            assert torch.equal(g, r) and g.stride() == r.stride() and g.dtype == r.dtype
        kept.append((got, module(x)))
    assert fast.stats()["fast"] - before["fast"] == 8  # every one of them served in C
    for got, want in kept:  # later runs did not write into earlier results
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=1e-5)
    got = model.run((_x(9),))  # a tuple is served too
    assert torch.equal(got[1], _python_path(model, [_x(9)])[1])


def test_unusual_calls_take_the_python_path_with_its_results_and_errors(art, model):
    x = _x(1)
    model.run([x])
    stats = model._fast_call.stats
    declined = stats()["fallback"]
    # caller's outputs, a parameter (a tensor subclass): served by the Python path
    outs = [torch.empty(4, 16), torch.empty(4, 8)]
    model.run([x], outs)
    assert torch.equal(outs[1], _python_path(model, [x])[1])
    assert torch.equal(model.run([nn.Parameter(x)])[0], _python_path(model, [x])[0])
    assert stats()["fallback"] - declined == 2
    # bad inputs: exactly the Python path's errors (a strided view and another shape run
    # in C and fail the .so's own input check; the rest are declined)
    strided = _x(1, (16, 4)).t()
    for bad in ([x, x], [], ["not a tensor"], [x.double()], [_x(2, (5, 16))], [strided], 7):
        want = _error(_python_path, model, bad)
        assert _error(model.run, bad) == want
    # and the model still runs in C afterwards
    fast = stats()["fast"]
    assert torch.equal(model.run([x])[0], _python_path(model, [x])[0])
    assert stats()["fast"] == fast + 1


def test_a_failed_run_reports_like_the_python_path(art, model):
    model.run([_x(0)])
    wrong = _x(3, (5, 16))  # the .so's compiled-in input check refuses the shape
    fast = model._fast_call.stats()["fast"]
    message = _error(model.run, [wrong])
    assert "AotiModelError" in message and "run failed" in message
    assert message == _error(_python_path, model, [wrong])
    assert model._fast_call.stats()["fast"] == fast  # a failed run is not counted as served
    assert torch.equal(model.run([_x(0)])[0], _python_path(model, [_x(0)])[0])


def test_closing_drops_the_fast_run_and_a_kept_one_declines(art):
    m = AotiModel(art[1].so_path, art[1].weights_path.read_bytes())
    m.run([_x(0)])
    kept = m._fast_call
    assert type(kept).__name__ == "FastRun"
    m.close()
    assert m._fast_call is None
    with pytest.raises(AotiModelError, match="closed"):
        m.run([_x(0)])
    with pytest.raises(AotiModelError, match="closed"):
        kept([_x(0)])  # the container is gone: it must not run


def test_a_dropped_model_is_freed_at_once(art):
    gc.disable()  # no cycle collector: only reference counting may free it
    try:
        m = AotiModel(art[1].so_path, art[1].weights_path.read_bytes())
        m.run([_x(0)])
        m.run([_x(0)])
        ref = weakref.ref(m)
        del m
        assert ref() is None
    finally:
        gc.enable()


def test_runs_from_two_threads_are_serialized_and_correct(art, model):
    xs = [_x(s) for s in range(4)]
    want = [_python_path(model, [x]) for x in xs]
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(300):
            j = (i + k) % len(xs)
            got = model.run([xs[j]])
            if not all(torch.equal(g, w) for g, w in zip(got, want[j])):
                errors.append(f"thread {k} run {i}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.rss_flat  # measures RSS: not under ASan (etmetal regress sanitize)
def test_ten_thousand_fast_runs_leave_storages_refcounts_and_rss_flat(model):
    x = _x(0)
    for _ in range(3000):
        model.run([x])
    s0, r0, refs0, fast0 = (
        memory_stats(),
        resident_bytes(),
        sys.getrefcount(x),
        model._fast_call.stats()["fast"],
    )
    for _ in range(10_000):
        out = model.run([x])
    s1, r1 = memory_stats(), resident_bytes()
    assert model._fast_call.stats()["fast"] - fast0 == 10_000
    assert (s1.tensors, s1.storages, s1.bytes) == (s0.tensors, s0.storages, s0.bytes)
    refs1 = sys.getrefcount(x)
    held = sys.getrefcount(out[0])  # (outside the assert: pytest's rewrite holds values)
    assert refs1 == refs0
    assert held == 2  # the list and the call's argument: the fast run keeps no reference
    assert r1 - r0 < MIB, f"RSS grew {(r1 - r0) / 1024:.0f} KiB"


def test_the_environment_switch_leaves_every_run_to_python(art):
    code = (
        "import sys, torch\n"
        "from etmetal.shims import AotiModel\n"
        "m = AotiModel(sys.argv[1], open(sys.argv[2], 'rb').read())\n"
        "x = torch.randn(4, 16)\n"
        "a, b = m.run([x]), m.run([x])\n"
        "assert type(m.run).__name__ == 'method', type(m.run)\n"
        "assert torch.equal(a[0], b[0])\n"
    )
    env = {**os.environ, "ETMETAL_FAST_RUN": "0", "PYTHONWARNINGS": "ignore"}
    args = [sys.executable, "-c", code, str(art[1].so_path), str(art[1].weights_path)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
