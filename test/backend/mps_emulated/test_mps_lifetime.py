"""Memory and bad input on the emulated Metal device, with the real MSL executor.

- 1,000 executes of an ``mps_emulated`` program leave live ``mps`` storages, shim tensors
  and shader libraries where the first execute left them;
- the ``shim_mps.h`` calls given bad input (missing/extra kernel arguments, an unknown
  kernel, MSL that fails to compile) return an error code with a readable
  ``last_error()``, and leak nothing; a run that hits such a failure raises.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from etmetal.examples.strided_views import CASES_BY_NAME
from etmetal.runtime import Runtime
from etmetal.shims import (
    AotiModel,
    AotiModelError,
    c_api,
    default_context,
    last_error,
    memory_stats,
)
from etmetal.shims.emulated_mps import mps_device, mps_kernels, msl

KERNELS = """
#include <metal_stdlib>
using namespace metal;
kernel void scale_add(device float* out [[buffer(0)]],
                      constant float* x [[buffer(1)]],
                      constant long& n [[buffer(2)]],
                      uint i [[thread_position_in_grid]]) {
    if ((long)i < n) out[i] = 2.0f * x[i] + 1.0f;
}
"""


def _chunk_cat():
    torch.manual_seed(0)
    case = CASES_BY_NAME["chunk_cat"]
    return case.make_module().eval(), case.make_inputs()


def test_a_thousand_executes_keep_live_mps_storages_constant(lowered_mps):
    low = lowered_mps("seed:chunk_cat", _chunk_cat)
    (expected,) = low.expected()
    method = Runtime.get().load_program(low.pte, trust_native_code=True).load_method("forward")
    try:
        (first,) = method.execute(list(low.inputs))
        torch.testing.assert_close(first, expected, atol=1e-5, rtol=1e-5)
        after_first = (
            mps_device.live_mps_storages(default_context()),
            mps_device.live_mps_bytes(default_context()),
            memory_stats().live(),
            mps_kernels.library_count(default_context()),
        )
        assert after_first[0] > 0  # the constants buffer lives with the method
        for _ in range(1000):
            (out,) = method.execute(list(low.inputs))
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert (
            mps_device.live_mps_storages(default_context()),
            mps_device.live_mps_bytes(default_context()),
            memory_stats().live(),
            mps_kernels.library_count(default_context()),
        ) == after_first
    finally:
        method.destroy()
    assert mps_device.live_mps_storages(default_context()) == 0 and memory_stats().storages == 0


@pytest.fixture
def lib():
    return c_api()


def _library(lib, source: str) -> tuple[int, int]:
    h = ctypes.c_void_p()
    rc = lib.aoti_torch_mps_create_shader_library(source.encode(), ctypes.byref(h))
    return rc, h.value


def test_real_kernel_runs_and_bad_dispatches_are_errors(lib):
    start = memory_stats().live(), mps_device.live_mps_storages(default_context())
    libs = mps_kernels.library_count(default_context())
    rc, library = _library(lib, KERNELS)
    assert rc == 0, last_error()
    fn = ctypes.c_void_p()
    assert lib.aoti_torch_mps_get_kernel_function(library, b"scale_add", ctypes.byref(fn)) == 0
    fn = fn.value
    x = torch.arange(37, dtype=torch.float32)
    out = torch.full((37,), -1.0)
    handles = []
    for t in (out, x):
        h = ctypes.c_void_p()
        sizes, strides = (ctypes.c_int64 * 1)(37), (ctypes.c_int64 * 1)(1)
        assert (
            lib.aoti_torch_create_tensor_from_blob(
                t.data_ptr(), 1, sizes, strides, 0, 6, 13, 0, ctypes.byref(h)
            )
            == 0
        )
        handles.append(h.value)
    lib.aoti_torch_mps_start_encoding(fn)
    lib.aoti_torch_mps_set_arg_tensor(fn, 0, handles[0])
    lib.aoti_torch_mps_set_arg_tensor(fn, 1, handles[1])
    lib.aoti_torch_mps_set_arg_int(fn, 2, 37)
    assert lib.aoti_torch_mps_dispatch_single_with_group_size(fn, 37, 8) == 0, last_error()
    torch.testing.assert_close(out, 2 * x + 1)
    # missing [[buffer(2)]]
    lib.aoti_torch_mps_start_encoding(fn)
    lib.aoti_torch_mps_set_arg_tensor(fn, 0, handles[0])
    lib.aoti_torch_mps_set_arg_tensor(fn, 1, handles[1])
    assert lib.aoti_torch_mps_dispatch_single(fn, 37) == 1
    assert "scale_add" in last_error() and "missing buffer index(es) [2]" in last_error()
    # an extra argument at index 3
    lib.aoti_torch_mps_start_encoding(fn)
    for i, h in enumerate(handles):
        lib.aoti_torch_mps_set_arg_tensor(fn, i, h)
    lib.aoti_torch_mps_set_arg_int(fn, 2, 37)
    lib.aoti_torch_mps_set_arg_int(fn, 3, 1)
    assert lib.aoti_torch_mps_dispatch_single(fn, 37) == 1
    assert "extra argument index(es) [3]" in last_error()
    # an unknown kernel name
    bad = ctypes.c_void_p()
    assert lib.aoti_torch_mps_get_kernel_function(library, b"nope", ctypes.byref(bad)) == 1
    assert "'nope'" in last_error() and "scale_add" in last_error()
    for h in handles:
        lib.aoti_torch_delete_tensor_object(h)
    assert lib.aoti_torch_mps_delete_shader_library(library) == 0
    assert (memory_stats().live(), mps_device.live_mps_storages(default_context())) == start
    assert mps_kernels.library_count(default_context()) == libs


def test_library_that_fails_to_compile_is_an_error(lib):
    libs = mps_kernels.library_count(default_context())
    source = KERNELS.replace("2.0f * x[i]", "undeclared_metal_function(x[i])")
    rc, library = _library(lib, source)
    assert rc == 1 and library is None
    assert "failed to compile" in last_error()
    assert mps_kernels.library_count(default_context()) == libs


def test_a_run_whose_library_fails_to_compile_raises_and_leaks_nothing(emulated_so, monkeypatch):
    """The wrapper ignores the return codes of the mps calls; the run must still fail."""
    module, inputs = _chunk_cat()
    so, weights = emulated_so(module, inputs)

    class Broken:
        MslError = msl.MslError

        @staticmethod
        def compile_library(source: str):
            raise msl.MslError("kernel 'generated_kernel': construct `injected` is not supported")

    # a private copy: a fresh load of the .so, whose shader libraries are not created yet
    import shutil
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "fresh.so"
        shutil.copy2(so, fresh)
        monkeypatch.setattr(mps_kernels, "_compiler", lambda: Broken)
        before = memory_stats().live(), mps_device.live_mps_storages(default_context())
        with (
            AotiModel(fresh, weights, device="mps") as model,
            pytest.raises(AotiModelError, match="failed to compile.*injected"),
        ):
            model.run(inputs)
        assert (memory_stats().live(), mps_device.live_mps_storages(default_context())) == before
