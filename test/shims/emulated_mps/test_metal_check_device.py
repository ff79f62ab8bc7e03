"""The checker through the emulated Metal device's shims (``aoti_torch_mps_*``), as a compiled
Metal wrapper drives it: the binding extents come from the bound tensors, a fault fails the
dispatch with its message by default, ``report`` mode keeps it, and the mode comes from
``ETMETAL_METAL_CHECK`` or ``set_metal_check``."""

from __future__ import annotations

import ctypes

import pytest
import torch

from etmetal.shims import c_api, default_context, last_error, standard_context
from etmetal.shims.emulated_mps import mps_device
from etmetal.shims.emulated_mps.check import CHECK_ENV
from etmetal.shims.storage import ShimError

ADD_ONE = """
#include <metal_stdlib>
using namespace metal;
kernel void add_one(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                    constant long& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  if ((long)i < n) out[i] = in[i] + 1.0f;
}
"""
N = 64


@pytest.fixture
def lib():
    api = c_api()
    previous = mps_device.set_metal_check(default_context(), None)
    yield api
    mps_device.set_metal_check(default_context(), previous)
    mps_device.check_report(default_context())


def _function(lib) -> tuple[int, int]:
    library, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.aoti_torch_mps_create_shader_library(ADD_ONE.encode(), ctypes.byref(library)) == 0
    assert lib.aoti_torch_mps_get_kernel_function(library, b"add_one", ctypes.byref(fn)) == 0
    return library.value, fn.value


def _view(lib, base: torch.Tensor, offset: int, n: int) -> int:
    """A shim tensor over ``n`` floats of ``base`` starting ``offset`` floats in."""
    h = ctypes.c_void_p()
    sizes, strides = (ctypes.c_int64 * 1)(n), (ctypes.c_int64 * 1)(1)
    rc = lib.aoti_torch_create_tensor_from_blob(
        base.data_ptr(), 1, sizes, strides, offset, 6, 13, 0, ctypes.byref(h)
    )
    assert rc == 0, last_error()
    return h.value


def _run(lib, fn: int, out: int, inp: int) -> int:
    lib.aoti_torch_mps_start_encoding(fn)
    lib.aoti_torch_mps_set_arg_tensor(fn, 0, out)
    lib.aoti_torch_mps_set_arg_tensor(fn, 1, inp)
    lib.aoti_torch_mps_set_arg_int(fn, 2, N)
    return lib.aoti_torch_mps_dispatch_single_with_group_size(fn, N, 32)


def test_an_offset_view_aliasing_its_input_fails_the_dispatch(lib):
    library, fn = _function(lib)
    buf = torch.zeros(N + 1)
    out, inp = _view(lib, buf, 1, N), _view(lib, buf, 0, N)  # out = buf[1:], in = buf[:-1]
    try:
        assert _run(lib, fn, out, inp) == 0  # unchecked: runs (and reads what it wrote)
        mps_device.set_metal_check(default_context(), "memcheck,racecheck")
        assert _run(lib, fn, out, inp) == 1
        message = last_error()
        assert "kernel 'add_one'" in message and "aliased bindings" in message
        assert "buffer(0) (written) and buffer(1) overlap in 252 bytes" in message
        mps_device.take_unchecked_error(default_context())
        # report mode: the dispatch succeeds and the fault is kept
        mps_device.set_metal_check(default_context(), "racecheck,report")
        assert _run(lib, fn, out, inp) == 0
        [fault] = mps_device.check_report(default_context())
        assert (fault.kernel, fault.buffer, fault.other_buffer) == ("add_one", 0, 1)
        assert mps_device.check_report(default_context()) == []
        # the same tensor bound twice (in place) is clean, and correct
        mps_device.set_metal_check(default_context(), "all")
        same = _view(lib, buf, 0, N)
        buf.zero_()
        assert _run(lib, fn, same, same) == 0, last_error()
        assert torch.equal(buf[:N], torch.ones(N))
        lib.aoti_torch_delete_tensor_object(same)
    finally:
        for h in (out, inp):
            lib.aoti_torch_delete_tensor_object(h)
        lib.aoti_torch_mps_delete_shader_library(library)
        mps_device.take_unchecked_error(default_context())


def test_the_binding_extent_is_the_bound_tensor(lib):
    library, fn = _function(lib)
    buf = torch.zeros(2 * N)
    out, small = _view(lib, buf, N, N), _view(lib, buf, 0, N - 4)  # 4 floats short
    try:
        mps_device.set_metal_check(default_context(), "memcheck")
        assert _run(lib, fn, out, small) == 1
        message = last_error()
        assert "out-of-bounds read" in message and "buffer(1) byte offset 240" in message
        assert "(+3 more like it)" in message  # threads 60..63
    finally:
        for h in (out, small):
            lib.aoti_torch_delete_tensor_object(h)
        lib.aoti_torch_mps_delete_shader_library(library)
        mps_device.take_unchecked_error(default_context())


def test_the_environment_variable_sets_a_new_contexts_mode(monkeypatch):
    monkeypatch.setenv(CHECK_ENV, "racecheck,report")
    mode = mps_device.mps_state(standard_context()).check
    assert mode.checks == {"racecheck"} and mode.collect
    monkeypatch.setenv(CHECK_ENV, "memcheck,racechek")
    with pytest.raises(ShimError, match=f"{CHECK_ENV}: unknown check 'racechek'"):
        mps_device.mps_state(standard_context())
    monkeypatch.delenv(CHECK_ENV)
    assert mps_device.mps_state(standard_context()).check is None
