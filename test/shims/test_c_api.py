"""The shims called under their C names through the trampoline, as a compiled ``.so`` calls them."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
import torch

from etmetal.shims import BridgeError, last_error, load_bridge, memory_stats
from etmetal.shims.abi_codes import constant_shims


def _libtorch_constant(name: str, restype):
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    fn = getattr(lib, name)
    fn.restype = restype
    return fn()


@pytest.mark.parametrize("name", sorted(constant_shims()))
def test_constant_shims_match_libtorch(name, cdrv):
    ours = cdrv.call(name)
    restype = ctypes.c_uint64 if name == "aoti_torch_abi_version" else ctypes.c_int32
    assert ours == _libtorch_constant(name, restype)


def test_getters_describe_empty_strided(cdrv):
    h = cdrv.empty((3, 4), (1, 3))  # column-major
    assert cdrv.geometry(h) == ((3, 4), (1, 3), 6)
    n, off, nbytes = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
    assert cdrv.lib.aoti_torch_get_numel(h, ctypes.byref(n)) == 0 and n.value == 12
    assert cdrv.lib.aoti_torch_get_storage_offset(h, ctypes.byref(off)) == 0 and off.value == 0
    assert cdrv.lib.aoti_torch_get_storage_size(h, ctypes.byref(nbytes)) == 0
    assert nbytes.value == 48
    contig = ctypes.c_bool()
    assert cdrv.lib.aoti_torch_is_contiguous(h, ctypes.byref(contig)) == 0
    assert contig.value is False
    assert cdrv.ptr(h) % 64 == 0  # host storages are aligned like Metal shared buffers
    assert cdrv.delete(h) == 0


def test_reinterpret_with_holes_writes_land_in_the_parent(cdrv):
    base = cdrv.empty((4, 32))
    cdrv.write(base, np.zeros((4, 32), np.float32))
    rc, left = cdrv.reinterpret(base, (4, 16), (32, 1), 0)
    assert rc == 0
    rc, right = cdrv.reinterpret(base, (4, 16), (32, 1), 16)
    assert rc == 0
    a = np.arange(64, dtype=np.float32).reshape(4, 16)
    cdrv.write(left, -a)
    cdrv.write(right, a)
    expected = np.concatenate([-a, a], axis=1)
    np.testing.assert_array_equal(cdrv.read(base), expected)
    stats = memory_stats()
    for h in (base, left):
        assert cdrv.delete(h) == 0
    # the offset view still holds the storage: nothing freed yet, and its data is intact
    assert memory_stats().storages == stats.storages
    np.testing.assert_array_equal(cdrv.read(right), a)
    assert cdrv.delete(right) == 0
    assert memory_stats().storages == stats.storages - 1


def test_new_tensor_handle_shares_storage(cdrv):
    h = cdrv.empty((5,))
    h2 = ctypes.c_void_p()
    assert cdrv.lib.aoti_torch_new_tensor_handle(h, ctypes.byref(h2)) == 0
    assert h2.value != h and cdrv.ptr(h2.value) == cdrv.ptr(h)
    cdrv.write(h2.value, np.arange(5, dtype=np.float32))
    assert cdrv.delete(h) == 0
    np.testing.assert_array_equal(cdrv.read(h2.value), np.arange(5, dtype=np.float32))
    assert cdrv.delete(h2.value) == 0


def test_blob_is_borrowed_and_never_freed(cdrv):
    blob = np.arange(24, dtype=np.float32)
    h = ctypes.c_void_p()
    rc = cdrv.lib.aoti_torch_create_tensor_from_blob_v2(
        blob.ctypes.data, 2, cdrv.i64s((2, 3)), cdrv.i64s((3, 1)), 6, 6, 0, 0, ctypes.byref(h),
        0, None, 0,
    )  # fmt: skip
    assert rc == 0, last_error()
    assert cdrv.ptr(h.value) == blob.ctypes.data + 6 * 4
    np.testing.assert_array_equal(cdrv.read(h.value), blob[6:12].reshape(2, 3))
    stats = memory_stats()
    assert stats.borrowed_storages >= 1
    bytes_before = stats.bytes
    assert cdrv.delete(h.value) == 0
    assert memory_stats().bytes == bytes_before  # borrowed bytes were never counted as owned
    np.testing.assert_array_equal(blob, np.arange(24, dtype=np.float32))


def test_copy_and_clone(cdrv):
    src = cdrv.from_torch(torch.arange(12.0).reshape(3, 4))
    dst = cdrv.empty((4, 3), (1, 4))  # same numel, other shape and layout
    assert cdrv.lib.aoti_torch_copy_(dst, src, 0) == 0, last_error()
    np.testing.assert_array_equal(cdrv.read(dst), np.arange(12.0).reshape(4, 3))
    out = ctypes.c_void_p()
    assert cdrv.lib.aoti_torch_clone_preserve_strides(dst, ctypes.byref(out)) == 0
    assert cdrv.geometry(out.value)[1] == (1, 4)
    np.testing.assert_array_equal(cdrv.read(out.value), cdrv.read(dst))
    for h in (src, dst, out.value):
        assert cdrv.delete(h) == 0


def test_invalid_calls_return_error_codes(cdrv):
    out = ctypes.c_void_p()
    cdrv.expect_failure("aoti_torch_delete_tensor_object", None, mentions="NULL")
    cdrv.expect_failure("aoti_torch_delete_tensor_object", 0xDEAD0, mentions="not a live tensor")
    h = cdrv.empty((2, 3))
    assert cdrv.delete(h) == 0
    cdrv.expect_failure("aoti_torch_delete_tensor_object", h, mentions="double delete")
    sizes = cdrv.i64s((2,))
    cdrv.expect_failure(
        "aoti_torch_empty_strided", -1, sizes, sizes, 6, 0, 0, ctypes.byref(out), mentions="ndim"
    )
    cdrv.expect_failure(
        "aoti_torch_empty_strided", 1, sizes, sizes, 99, 0, 0, ctypes.byref(out),
        mentions="unsupported dtype",
    )  # fmt: skip
    cdrv.expect_failure(
        "aoti_torch_empty_strided", 1, sizes, sizes, 6, 1, 0, ctypes.byref(out),
        mentions="no allocator",
    )  # fmt: skip
    cdrv.expect_failure("aoti_torch_empty_strided", 1, sizes, sizes, 6, 0, 0, None, mentions="NULL")
    a, b, d = cdrv.empty((2, 3)), cdrv.empty((7,)), cdrv.empty((6,), dtype=7)
    cdrv.expect_failure("aoti_torch_copy_", a, b, 0, mentions="numel mismatch")
    cdrv.expect_failure("aoti_torch_copy_", a, d, 0, mentions="dtype mismatch")
    cdrv.expect_failure(
        "aoti_torch__reinterpret_tensor", a, 2, cdrv.i64s((2, 3)), cdrv.i64s((3, 1)), 1,
        ctypes.byref(out), mentions="reaches byte",
    )  # fmt: skip
    cdrv.expect_failure("aoti_torch_get_dim", a, None, mentions="NULL")
    cdrv.expect_failure("aoti_torch_cpu_mm_out", a, a, a, mentions="cannot multiply")
    for h in (a, b, d):
        assert cdrv.delete(h) == 0


def test_check_passes_through_when_true(cdrv):
    cdrv.lib.aoti_torch_check(True, b"f", b"file", 1, b"fine")
    assert "aoti_torch_check" in load_bridge().exported
    with pytest.raises(BridgeError, match="cannot be called with a false condition"):
        cdrv.lib.aoti_torch_check(False, b"f", b"file", 1, b"boom")


def _t(cdrv, h) -> torch.Tensor:
    return torch.from_numpy(cdrv.read(h))


def test_mm_out_into_a_view_with_holes(cdrv):
    a, b = torch.randn(4, 8), torch.randn(8, 6)
    ha, hb = cdrv.from_torch(a), cdrv.from_torch(b)
    base = cdrv.empty((4, 12))
    cdrv.write(base, np.zeros((4, 12), np.float32))
    rc, right = cdrv.reinterpret(base, (4, 6), (12, 1), 6)
    assert cdrv.lib.aoti_torch_cpu_mm_out(right, ha, hb) == 0, last_error()
    got = _t(cdrv, base)
    torch.testing.assert_close(got[:, 6:], a @ b)
    assert torch.count_nonzero(got[:, :6]) == 0
    for h in (ha, hb, base, right):
        assert cdrv.delete(h) == 0


def test_addmm_and_bmm_out_match_eager(cdrv):
    bias, x, w = torch.randn(6), torch.randn(4, 8), torch.randn(6, 8)
    hb, hx, hw = cdrv.from_torch(bias), cdrv.from_torch(x), cdrv.from_torch(w)
    rc, wt = cdrv.reinterpret(hw, (8, 6), (1, 8), 0)  # transposed weight, as AOTI passes it
    out = cdrv.empty((4, 6))
    assert cdrv.lib.aoti_torch_cpu_addmm_out(out, hb, hx, wt, 0.5, 2.0) == 0, last_error()
    torch.testing.assert_close(_t(cdrv, out), torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0))
    p, q = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    hp, hq, hbo = cdrv.from_torch(p), cdrv.from_torch(q), cdrv.empty((3, 4, 2))
    assert cdrv.lib.aoti_torch_cpu_bmm_out(hbo, hp, hq) == 0, last_error()
    torch.testing.assert_close(_t(cdrv, hbo), torch.bmm(p, q))
    for h in (hb, hx, hw, wt, out, hp, hq, hbo):
        assert cdrv.delete(h) == 0


def test_convolution_matches_eager(cdrv):
    x, w, b = torch.randn(1, 4, 7, 7), torch.randn(6, 2, 3, 3), torch.randn(6)
    hx, hw, hb = cdrv.from_torch(x), cdrv.from_torch(w), cdrv.from_torch(b)
    bias_ptr, ret = ctypes.c_void_p(hb), ctypes.c_void_p()
    i64 = cdrv.i64s
    rc = cdrv.lib.aoti_torch_cpu_convolution(
        hx, hw, ctypes.byref(bias_ptr), i64((2, 1)), 2, i64((1, 0)), 2, i64((1, 1)), 2, 0,
        i64((0, 0)), 2, 2, ctypes.byref(ret),
    )  # fmt: skip
    assert rc == 0, last_error()
    ref = torch.nn.functional.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), groups=2)
    torch.testing.assert_close(_t(cdrv, ret.value), ref)
    for h in (hx, hw, hb, ret.value):
        assert cdrv.delete(h) == 0


def test_sdpa_and_topk_match_eager(cdrv):
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    hq, hk, hv = (cdrv.from_torch(t) for t in (q, k, v))
    scale = ctypes.c_double(0.3)
    r0, r1 = ctypes.c_void_p(), ctypes.c_void_p()
    rc = cdrv.lib.aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu(
        hq, hk, hv, 0.0, 1, None, ctypes.byref(scale), ctypes.byref(r0), ctypes.byref(r1)
    )
    assert rc == 0, last_error()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(_t(cdrv, r0.value), ref, atol=1e-5, rtol=1e-5)
    m0, m1 = ctypes.c_void_p(), ctypes.c_void_p()
    rc = cdrv.lib.aoti_torch_mps__scaled_dot_product_attention_math_for_mps(
        hq, hk, hv, None, 0.0, 0, None, None, ctypes.byref(m0), ctypes.byref(m1)
    )
    assert rc == 0, last_error()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(_t(cdrv, m0.value), ref, atol=1e-5, rtol=1e-5)
    x = torch.randn(3, 10)
    hx, vals, idx = cdrv.from_torch(x), ctypes.c_void_p(), ctypes.c_void_p()
    rc = cdrv.lib.aoti_torch_cpu_topk(hx, 4, -1, 1, 1, ctypes.byref(vals), ctypes.byref(idx))
    assert rc == 0, last_error()
    ref_vals, ref_idx = torch.topk(x, 4, -1)
    torch.testing.assert_close(_t(cdrv, vals.value), ref_vals)
    np.testing.assert_array_equal(cdrv.read(idx.value, np.int64), ref_idx.numpy())
    for h in (hq, hk, hv, r0.value, r1.value, m0.value, m1.value, hx, vals.value, idx.value):
        assert cdrv.delete(h) == 0


@pytest.mark.parametrize(
    "name, ctype, value",
    [("float32", ctypes.c_float, 2.5), ("float64", ctypes.c_double, -1.25),
     ("int64", ctypes.c_int64, 1 << 40), ("int32", ctypes.c_int32, -7), ("bool", ctypes.c_bool, True)],
)  # fmt: skip
def test_scalar_round_trip(cdrv, name, ctype, value):
    h, got = ctypes.c_void_p(), ctype()
    to_tensor = getattr(cdrv.lib, f"aoti_torch_scalar_to_tensor_{name}")
    assert to_tensor(value, ctypes.byref(h)) == 0, last_error()
    assert cdrv.geometry(h.value)[0] == ()
    assert getattr(cdrv.lib, f"aoti_torch_item_{name}")(h.value, ctypes.byref(got)) == 0
    assert got.value == value
    other = "float64" if name != "float64" else "float32"
    cdrv.expect_failure(f"aoti_torch_item_{other}", h.value, ctypes.byref(got), mentions="dtype")
    assert cdrv.delete(h.value) == 0
