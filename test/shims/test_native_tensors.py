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


def _clone(cdrv, h: int) -> int:
    """A Python shim call on ``h`` (adopts it if it is native)."""
    out = ctypes.c_void_p()
    assert cdrv.call("aoti_torch_clone", h, ctypes.byref(out)) == 0, last_error()
    return out.value


def test_native_view_shares_its_parent_and_keeps_it_alive(cdrv):
    before = memory_stats()
    h = cdrv.empty((4, 6))
    cdrv.write(h, np.zeros((4, 6), np.float32))
    rc, view = cdrv.reinterpret(h, (4, 3), (6, 1), 3)  # right half, served in C
    assert rc == 0, last_error()
    assert _is_native(h) and _is_native(view) and not CTX.handles.keys() & {h, view}
    assert cdrv.geometry(view) == ((4, 3), (6, 1), FLOAT32)
    assert cdrv.ptr(view) == cdrv.ptr(h) + 3 * 4
    stats = memory_stats()
    assert (stats.tensors, stats.storages) == (before.tensors + 2, before.storages + 1)
    assert stats.bytes == before.bytes + 4 * 6 * 4  # one allocation, two tensors
    cdrv.write(view, np.full((4, 3), 7, np.float32))
    want = np.zeros((4, 6), np.float32)
    want[:, 3:] = 7
    np.testing.assert_array_equal(cdrv.read(h), want)  # the write went to the parent
    assert cdrv.delete(h) == 0  # the view keeps the allocation alive
    again = [cdrv.empty((4, 6)) for _ in range(4)]  # same size: would reuse freed memory
    for g in again:
        cdrv.write(g, np.full((4, 6), -1, np.float32))
    np.testing.assert_array_equal(cdrv.read(view), want[:, 3:])
    assert memory_stats().storages == before.storages + 1 + len(again)
    for g in again + [view]:
        assert cdrv.delete(g) == 0
    assert memory_stats().live() == before.live()


def test_view_of_a_view_accumulates_the_offset_and_checks_the_storage(cdrv):
    h = cdrv.empty((10,))
    cdrv.write(h, np.arange(10, dtype=np.float32))
    rc, a = cdrv.reinterpret(h, (6,), (1,), 2)
    assert rc == 0, last_error()
    rc, b = cdrv.reinterpret(a, (2, 2), (2, 1), 3)  # offset 2 + 3 in the same storage
    assert rc == 0, last_error()
    assert _is_native(b)
    np.testing.assert_array_equal(cdrv.read(b), np.arange(5, 9, dtype=np.float32).reshape(2, 2))
    # one element too far: not served in C, so Python reports it (naming the storage size)
    out = ctypes.c_void_p()
    msg = cdrv.expect_failure(
        "aoti_torch__reinterpret_tensor",
        a,
        1,
        cdrv.i64s((4,)),
        cdrv.i64s((2,)),
        2,
        ctypes.byref(out),
        mentions="storage has 40 bytes",
    )
    assert "reaches byte 44" in msg
    for neg_sizes, neg_strides in (((-1,), (1,)), ((2,), (-1,))):
        cdrv.expect_failure(
            "aoti_torch__reinterpret_tensor",
            a,
            1,
            cdrv.i64s(neg_sizes),
            cdrv.i64s(neg_strides),
            0,
            ctypes.byref(out),
            mentions="negative",
        )
    for x in (b, a, h):
        assert cdrv.delete(x) == 0


def test_python_adopts_native_views_into_one_storage(cdrv):
    before = memory_stats()
    h = cdrv.empty((4, 6))
    cdrv.write(h, np.arange(24, dtype=np.float32).reshape(4, 6))
    views = [cdrv.reinterpret(h, (4, 3), (6, 1), k)[1] for k in (0, 3)]
    copies = [_clone(cdrv, v) for v in views]  # adopts both views (Python shim calls)
    assert not any(_is_native(v) for v in views) and _is_native(h)
    t0, t1 = CTX.lookup(views[0]), CTX.lookup(views[1])
    assert t0.storage is t1.storage and t0.storage.count == 2
    assert memory_stats().storages == before.storages + 3  # the parent's, and two clones'
    assert cdrv.delete(h) == 0  # the last native record: the allocation is Python's alone
    cdrv.write(views[1], np.full((4, 3), 5, np.float32))
    whole = CTX.lookup(views[0]).torch().as_strided((4, 6), (6, 1), 0)
    assert (whole[:, 3:] == 5).all() and torch.equal(
        whole[:, :3], torch.arange(24.0).reshape(4, 6)[:, :3]
    )
    np.testing.assert_array_equal(cdrv.read(copies[1]), np.arange(24.0).reshape(4, 6)[:, 3:])
    for x in views + copies:
        assert cdrv.delete(x) == 0
    assert memory_stats().live() == before.live()


def test_upstream_copy_policy_keeps_views_in_python(cdrv):
    from etmetal.shims import set_materialize

    h = cdrv.empty((4, 6))
    previous = set_materialize("upstream_copy")
    try:
        rc, packed_copy = cdrv.reinterpret(h, (4, 3), (6, 1), 3)  # has holes: materialized
        assert rc == 0, last_error()
        assert not _is_native(packed_copy)
        assert CTX.lookup(packed_copy).storage is not CTX.lookup(h).storage
    finally:
        set_materialize(previous)
    rc, view = cdrv.reinterpret(h, (4, 3), (6, 1), 3)
    assert rc == 0 and CTX.lookup(view).storage is CTX.lookup(h).storage
    for x in (packed_copy, view, h):
        assert cdrv.delete(x) == 0


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
