"""Getters answered in C from the handle's record agree with the Python shims (the reference)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from etmetal.shims import default_context, last_error, load_bridge
from etmetal.shims.record_table import Records

GETTERS_1 = [  # (name, ctypes type of the out-parameter)
    ("aoti_torch_get_data_ptr", ctypes.c_void_p),
    ("aoti_torch_get_dim", ctypes.c_int64),
    ("aoti_torch_get_dtype", ctypes.c_int32),
    ("aoti_torch_get_device_type", ctypes.c_int32),
    ("aoti_torch_get_device_index", ctypes.c_int32),
    ("aoti_torch_get_storage_offset", ctypes.c_int64),
    ("aoti_torch_get_numel", ctypes.c_int64),
]


def _via_c(cdrv, name, h, ctype, *extra):
    out = ctype()
    rc = getattr(cdrv.lib, name)(h, *extra, ctypes.byref(out))
    assert rc == 0, last_error()
    return out.value


def _via_python(name, h, ctype, *extra):
    out = ctype()
    ctx = default_context()
    ctx.shims[name](ctx, h, *extra, ctypes.addressof(out))  # the Python implementation, no bridge
    return out.value


@pytest.mark.parametrize(
    "shape,view",
    [
        ((2, 3, 4), lambda s: (s, None, 0)),
        ((4, 6), lambda s: ((3, 2), (1, 4), 5)),  # strided view with an offset
        ((), lambda s: (s, None, 0)),
        ((2,) * 9, lambda s: (s, None, 0)),  # more dims than a record holds: Python path
    ],
)
def test_native_getters_agree_with_python(cdrv, shape, view):
    bridge = load_bridge()
    base = cdrv.empty(shape)
    sizes, strides, offset = view(shape)
    h = base
    if strides is not None:
        rc, h = cdrv.reinterpret(base, sizes, strides, offset)
        assert rc == 0, last_error()
    records = default_context().records
    native = records is not None and records.contains(h)
    assert native == (len(sizes) <= Records.MAX_DIMS)
    for name, ctype in GETTERS_1:
        before = bridge.calls
        assert _via_c(cdrv, name, h, ctype) == _via_python(name, h, ctype), name
        assert bridge.calls == before + 1  # counted either way: the binding proof holds
    got_sizes, got_strides, _ = cdrv.geometry(h)
    t = default_context().lookup(h)
    assert (got_sizes, got_strides) == (t.sizes, t.strides)
    want = torch.empty(shape).as_strided(sizes, strides or torch.empty(sizes).stride())
    assert got_sizes == tuple(want.shape) and got_strides == tuple(want.stride())
    for d in range(-len(sizes), len(sizes)):
        for name in ("aoti_torch_get_size", "aoti_torch_get_stride"):
            assert _via_c(cdrv, name, h, ctypes.c_int64, d) == _via_python(
                name, h, ctypes.c_int64, d
            )
    if h != base:
        assert cdrv.delete(h) == 0
    assert cdrv.delete(base) == 0


def test_deleted_and_bad_handles_still_fail_with_a_message(cdrv):
    h = cdrv.empty((3, 4))
    assert cdrv.delete(h) == 0
    out = ctypes.c_int64()
    cdrv.expect_failure("aoti_torch_get_dim", h, ctypes.byref(out), mentions="not a live tensor")
    cdrv.expect_failure("aoti_torch_get_dim", 0x1230, ctypes.byref(out), mentions="not a live")
    cdrv.expect_failure(
        "aoti_torch_delete_tensor_object", h, mentions="not a live tensor"
    )  # double delete
    h = cdrv.empty((3, 4))
    cdrv.expect_failure("aoti_torch_get_size", h, 2, ctypes.byref(out), mentions="out of range")
    cdrv.expect_failure("aoti_torch_get_dim", h, None, mentions="NULL")
    assert cdrv.delete(h) == 0
