"""The one-call run (``shims/fast_run.py``) on the emulated Metal device: an mps model's and
an mps ``.pte`` method's steady run is served in C (its ``fast`` counter, not a timer), with
the bits of the Python path and eager, and a launch failure inside it (the Metal wrapper
ignores its launches' return codes; C reads the device's record after the run) raises the
general path's error, word for word."""

from __future__ import annotations

import ctypes

import pytest
import torch

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.examples import metal_registry
from etmetal.shims import AotiModel, default_context, fast_run, memory_stats
from etmetal.shims.emulated_mps import mps_device

TARGET = "mps_emulated"
NAME = "add"  # one Metal kernel: its launch is what the failure tests refuse
_ARTS: dict[str, object] = {}


@pytest.fixture
def no_leaks():
    yield
    stats = memory_stats()
    assert (stats.tensors, stats.storages, stats.bytes) == (0, 0, 0), stats
    assert mps_device.live_mps_storages(default_context()) == 0


def _module_and_inputs():
    return metal_registry.get_model_and_inputs(NAME)


def _art():
    if "so" not in _ARTS:
        module, inputs = _module_and_inputs()
        with torch.no_grad():
            ep = torch.export.export(module.eval(), tuple(inputs))
        _ARTS["so"] = compile_exported_program(ep, target=TARGET)
    return _ARTS["so"]


def _program():
    if "pte" not in _ARTS:
        from etmetal.backend.lowering import lower

        module, inputs = _module_and_inputs()
        _ARTS["pte"] = lower(module.eval(), tuple(inputs), target=TARGET, runtime="etmetal")[0]
    return _ARTS["pte"]


def _method():
    from etmetal.runtime import Runtime

    program = Runtime.get().load_program(_program().buffer, trust_native_code=True)
    return program.load_method("forward")


def _eager(inputs):
    module, _ = _module_and_inputs()
    with torch.no_grad():
        return module.eval()(*inputs)


def _error(fn, *args) -> str:
    with pytest.raises(Exception) as info:
        fn(*args)
    return f"{type(info.value).__name__}: {info.value}"


class _RefuseLaunches:
    """Every Metal launch refused in C (a launch limit of one thread), as the emulated
    device's own fault tests do: the wrapper ignores the failure, the device records it."""

    def __enter__(self):
        lib = default_context().load_bridge().lib
        self._limit = ctypes.c_uint64.in_dll(lib, "etm_mps_launch_limit")
        self._saved, self._limit.value = self._limit.value, 1
        return self

    def __exit__(self, *exc):
        self._limit.value = self._saved


def test_an_mps_models_steady_run_is_served_in_c_with_the_python_paths_bits(no_leaks):
    entry = metal_registry.REGISTRY[NAME]
    _, inputs = _module_and_inputs()
    art = _art()
    with AotiModel(art.so_path, art.weights_bytes(), device="mps") as model:
        fast = model._fast_call
        assert type(fast).__name__ == "FastRun"
        model.run(list(inputs))  # the first run teaches the outputs (Python's)
        before = fast.stats()
        outs = [model.run(list(inputs))[0] for _ in range(5)]
        after = fast.stats()
        reference = model.run_into(list(inputs))[0]  # ModelRunner's Python steady path
    assert after["fast"] - before["fast"] == 5 and after["fallback"] == before["fallback"]
    for out in outs:
        assert torch.equal(out, reference)
    assert outs[0].data_ptr() != outs[1].data_ptr()  # each run's own tensor
    torch.testing.assert_close(outs[0], _eager(inputs), atol=entry.atol, rtol=entry.rtol)


def test_a_launch_failure_in_the_fast_run_raises_the_python_paths_error(no_leaks):
    _, inputs = _module_and_inputs()
    art = _art()
    with AotiModel(art.so_path, art.weights_bytes(), device="mps") as model:
        for _ in range(3):
            (good,) = model.run(list(inputs))
        stats = model._fast_call.stats
        served = stats()["fast"]
        with _RefuseLaunches():
            fast_message = _error(model.run, list(inputs))
            python_message = _error(model.run_into, list(inputs))
        assert "does not check failed" in fast_message and "launch" in fast_message
        assert fast_message == python_message
        assert stats()["fast"] == served  # a failed run is not counted as served
        (again,) = model.run(list(inputs))  # the device recovers, in C again
        assert stats()["fast"] == served + 1
    assert torch.equal(good, again)


def test_a_failure_recorded_before_the_run_is_left_to_the_python_path(no_leaks):
    """A record left from outside any run: the general path clears it before its run, so
    the fast run declines the call rather than report a failure that is not this run's."""
    _, inputs = _module_and_inputs()
    art = _art()
    ctx = default_context()
    with AotiModel(art.so_path, art.weights_bytes(), device="mps") as model:
        for _ in range(2):
            (good,) = model.run(list(inputs))
        stats = model._fast_call.stats
        before = stats()
        mps_device.mps_state(ctx).unchecked_error = "aoti_torch_mps_dispatch: left over"
        (out,) = model.run(list(inputs))
        assert stats()["fallback"] == before["fallback"] + 1
        assert stats()["fast"] == before["fast"]
        assert mps_device.mps_state(ctx).unchecked_error == ""
    assert torch.equal(out, good)


def test_an_mps_pte_methods_steady_execute_takes_the_one_call_path(no_leaks):
    entry = metal_registry.REGISTRY[NAME]
    _, inputs = _module_and_inputs()
    method = _method()
    try:
        fast = method._fast_execute
        assert fast is not None
        for _ in range(2):
            method.execute(list(inputs))
        before = fast.stats()
        outs = [method.execute(list(inputs))[0] for _ in range(4)]
        after = fast.stats()
    finally:
        method.destroy()
    assert after["fast"] - before["fast"] == 4 and after["fallback"] == before["fallback"]
    for out in outs:
        torch.testing.assert_close(out, _eager(inputs), atol=entry.atol, rtol=entry.rtol)


def test_a_launch_failure_in_a_pte_methods_fast_execute_raises_the_general_error(
    monkeypatch, no_leaks
):
    _, inputs = _module_and_inputs()

    def failing_execute(method) -> str:
        try:
            for _ in range(3):
                (good,) = method.execute(list(inputs))
            with _RefuseLaunches():
                message = _error(method.execute, list(inputs))
            (again,) = method.execute(list(inputs))
            assert torch.equal(good, again)
            return message
        finally:
            method.destroy()

    fast_method = _method()
    fast = fast_method._fast_execute
    fast_message = failing_execute(fast_method)
    assert fast.stats()["fast"] >= 2  # the runs around the failure were served in C
    with monkeypatch.context() as patch:
        patch.setattr(fast_run, "_native", lambda: None)  # no one-call run anywhere
        general = _method()
        assert general._fast_execute is None
        general_message = failing_execute(general)
    assert "does not check failed" in fast_message
    assert fast_message == general_message
