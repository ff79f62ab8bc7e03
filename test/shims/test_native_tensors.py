"""Native tensors: ``empty_strided``/``delete`` served in C, adopted by Python on first touch."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from etmetal.shims import HOST_ALLOCATOR, default_context, last_error, memory_stats
from etmetal.shims.native_tensors import NATIVE_LIMIT, TABLE_SLOTS

FLOAT32, INT64 = 6, 4
CTX = default_context()


def _is_native(h: int) -> bool:
    return CTX.native.read(h) is not None


@pytest.mark.parametrize(
    "sizes,strides",
    [((2, 3), None), ((4, 1, 5), (5, 20, 1)), ((), None), ((3, 0, 2), None), ((2, 2), (1, 2))],
)
def test_native_empty_has_the_requested_geometry(cdrv, sizes, strides):
    before = memory_stats()
    h = cdrv.empty(sizes, strides)
    assert _is_native(h) and h not in CTX.handles  # Python has not seen it
    want = torch.empty_strided(sizes, strides or torch.empty(sizes).stride())
    assert cdrv.geometry(h) == (tuple(want.shape), tuple(want.stride()), FLOAT32)
    assert cdrv.ptr(h) % 64 == 0
    extent = want.untyped_storage().nbytes()
    stats = memory_stats()
    assert (stats.tensors, stats.storages) == (before.tensors + 1, before.storages + 1)
    assert stats.bytes == before.bytes + extent
    values = np.arange(want.numel(), dtype=np.float32).reshape(want.shape)
    cdrv.write(h, values)
    np.testing.assert_array_equal(cdrv.read(h), values)
    assert cdrv.delete(h) == 0


def test_python_adopts_a_native_tensor_and_keeps_view_semantics(cdrv):
    h = cdrv.empty((4, 6))
    cdrv.write(h, np.zeros((4, 6), np.float32))
    rc, view = cdrv.reinterpret(h, (4, 3), (6, 1), 3)  # right half: a Python shim call
    assert rc == 0, last_error()
    assert h in CTX.handles and not _is_native(h)  # adopted on first touch
    cdrv.write(view, np.full((4, 3), 7, np.float32))
    want = np.zeros((4, 6), np.float32)
    want[:, 3:] = 7
    np.testing.assert_array_equal(cdrv.read(h), want)  # the write went to the parent
    assert cdrv.delete(h) == 0  # the view keeps the storage alive
    np.testing.assert_array_equal(cdrv.read(view), want[:, 3:])
    assert cdrv.delete(view) == 0


def test_aten_view_of_an_adopted_tensor_outlives_its_handle(cdrv):
    h = cdrv.empty((8,))
    cdrv.write(h, np.arange(8, dtype=np.float32))
    aten = CTX.lookup(h).torch()
    assert cdrv.delete(h) == 0
    again = [cdrv.empty((8,)) for _ in range(4)]  # same size: would reuse freed memory
    for g in again:
        cdrv.write(g, np.full(8, -1, np.float32))
    torch.testing.assert_close(aten, torch.arange(8, dtype=torch.float32))
    for g in again:
        assert cdrv.delete(g) == 0


def test_large_poisoned_and_invalid_requests_go_to_python(cdrv):
    big = cdrv.empty((NATIVE_LIMIT // 4 + 1,))
    assert not _is_native(big) and big in CTX.handles
    assert cdrv.delete(big) == 0
    HOST_ALLOCATOR.fill_byte = 0xFF
    try:
        h = cdrv.empty((2, 2))
        assert not _is_native(h)
        assert np.isnan(cdrv.read(h)).all()  # every allocation was poisoned
        assert cdrv.delete(h) == 0
    finally:
        HOST_ALLOCATOR.fill_byte = None
    assert _is_native(h2 := cdrv.empty((2, 2)))
    assert cdrv.delete(h2) == 0
    out = ctypes.c_void_p()
    cdrv.expect_failure(
        "aoti_torch_empty_strided",
        2,
        cdrv.i64s((2, -3)),
        cdrv.i64s((3, 1)),
        FLOAT32,
        0,
        0,
        ctypes.byref(out),
        mentions="negative",
    )
    cdrv.expect_failure(
        "aoti_torch_empty_strided",
        1,
        cdrv.i64s((2,)),
        None,
        99,
        0,
        0,
        ctypes.byref(out),
        mentions="dtype",
    )


def test_double_delete_of_a_native_handle_is_an_error(cdrv):
    h = cdrv.empty((3,))
    assert cdrv.delete(h) == 0
    cdrv.expect_failure("aoti_torch_delete_tensor_object", h, mentions="not a live tensor")
    getter = ctypes.c_int64()
    assert cdrv.call("aoti_torch_get_dim", h, ctypes.byref(getter)) == 1


def test_running_out_of_native_slots_falls_back_to_python(cdrv):
    native_api = CTX.native
    adopted = sum(1 for h in CTX.handles if native_api.in_native_half(h))
    free = TABLE_SLOTS // 2 - native_api.counter("live") - adopted  # native slots still free
    n = free + 10
    handles = [cdrv.empty((2,), dtype=INT64) for _ in range(n)]
    native = sum(_is_native(h) for h in handles)
    assert native == free  # the native half, then Python's handles
    assert len(set(handles)) == n
    cdrv.write(handles[-1], np.array([5, 6], np.int64))
    np.testing.assert_array_equal(cdrv.read(handles[-1], np.int64), [5, 6])
    for h in handles:
        assert cdrv.delete(h) == 0
