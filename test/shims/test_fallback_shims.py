"""The fallback shims the partitioner now allows on ``host`` (baddbmm, max-pool with
indices, adaptive average pool) and the grouped-query Metal attention, against eager."""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from etmetal.shims import last_error


def _t(cdrv, h) -> torch.Tensor:
    return torch.from_numpy(cdrv.read(h))


def test_baddbmm_out_matches_eager(cdrv):
    bias, a, b = torch.randn(3, 4, 2), torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    hs = [cdrv.from_torch(t) for t in (bias, a, b)]
    out = cdrv.empty((3, 4, 2))
    assert cdrv.lib.aoti_torch_cpu_baddbmm_out(out, *hs, 0.5, 2.0) == 0, last_error()
    want = torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0)
    torch.testing.assert_close(_t(cdrv, out), want)
    for h in (*hs, out):
        assert cdrv.delete(h) == 0


def test_max_pool2d_with_indices_matches_eager(cdrv):
    x = torch.randn(1, 2, 7, 9)
    hx, r0, r1 = cdrv.from_torch(x), ctypes.c_void_p(), ctypes.c_void_p()
    k, s, p, d = cdrv.i64s([3, 3]), cdrv.i64s([2, 2]), cdrv.i64s([1, 1]), cdrv.i64s([1, 1])
    rc = cdrv.lib.aoti_torch_cpu_max_pool2d_with_indices(
        hx, k, 2, s, 2, p, 2, d, 2, 1, ctypes.byref(r0), ctypes.byref(r1)
    )
    assert rc == 0, last_error()
    want, idx = torch.nn.functional.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    torch.testing.assert_close(_t(cdrv, r0.value), want)
    assert torch.equal(torch.from_numpy(cdrv.read(r1.value, np.int64)), idx)
    for h in (hx, r0.value, r1.value):
        assert cdrv.delete(h) == 0


def test_adaptive_avg_pool2d_matches_eager(cdrv):
    x = torch.randn(1, 3, 7, 10)
    hx, r0 = cdrv.from_torch(x), ctypes.c_void_p()
    rc = cdrv.lib.aoti_torch_cpu__adaptive_avg_pool2d(hx, cdrv.i64s([3, 4]), 2, ctypes.byref(r0))
    assert rc == 0, last_error()
    torch.testing.assert_close(
        _t(cdrv, r0.value), torch.nn.functional.adaptive_avg_pool2d(x, (3, 4))
    )
    for h in (hx, r0.value):
        assert cdrv.delete(h) == 0


def test_mps_attention_v2_with_grouped_query_heads_matches_eager(cdrv):
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    hs = [cdrv.from_torch(t) for t in (q, k, v)]
    r0, r1 = ctypes.c_void_p(), ctypes.c_void_p()
    rc = cdrv.lib.aoti_torch_mps__scaled_dot_product_attention_math_for_mps_v2(
        *hs, None, 0.0, 1, None, None, 1, ctypes.byref(r0), ctypes.byref(r1)
    )
    assert rc == 0, last_error()
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    torch.testing.assert_close(_t(cdrv, r0.value), want, atol=1e-5, rtol=1e-5)
    for h in (*hs, r0.value, r1.value):
        assert cdrv.delete(h) == 0


def _int_tensor(cdrv, t: torch.Tensor, code: int) -> int:
    h = cdrv.empty(tuple(t.shape), tuple(t.stride()), dtype=code)
    cdrv.write(h, t.numpy())
    return h


def test_cumsum_of_an_int_mask_with_and_without_a_result_dtype_matches_eager(cdrv):
    # the shape of an HF decoder's position ids: cumsum over a 0/1 mask
    mask = (torch.rand(2, 9) > 0.3).to(torch.int32)
    hx = _int_tensor(cdrv, mask, 3)  # c10 Int
    r0, r1 = ctypes.c_void_p(), ctypes.c_void_p()
    as_long = ctypes.c_int32(4)  # c10 Long
    assert cdrv.lib.aoti_torch_cpu_cumsum(hx, 1, ctypes.byref(as_long), ctypes.byref(r0)) == 0
    assert cdrv.lib.aoti_torch_cpu_cumsum(hx, -1, None, ctypes.byref(r1)) == 0, last_error()
    assert cdrv.geometry(r0.value)[2] == 4 and cdrv.geometry(r1.value)[2] == 4  # int promotes
    want = torch.cumsum(mask, 1)
    assert torch.equal(torch.from_numpy(cdrv.read(r0.value, np.int64)), want)
    assert torch.equal(torch.from_numpy(cdrv.read(r1.value, np.int64)), want)
    for h in (hx, r0.value, r1.value):
        assert cdrv.delete(h) == 0


def test_cumprod_and_logcumsumexp_match_eager(cdrv):
    x = torch.rand(3, 5) + 0.5
    hx, r0, r1 = cdrv.from_torch(x), ctypes.c_void_p(), ctypes.c_void_p()
    assert cdrv.lib.aoti_torch_cpu_cumprod(hx, 0, None, ctypes.byref(r0)) == 0, last_error()
    assert cdrv.lib.aoti_torch_cpu_logcumsumexp(hx, 1, ctypes.byref(r1)) == 0, last_error()
    torch.testing.assert_close(_t(cdrv, r0.value), torch.cumprod(x, 0))
    torch.testing.assert_close(_t(cdrv, r1.value), torch.logcumsumexp(x, 1))
    for h in (hx, r0.value, r1.value):
        assert cdrv.delete(h) == 0


def test_scan_with_a_bad_dim_or_dtype_code_is_an_error_naming_it(cdrv):
    hx, r0 = cdrv.from_torch(torch.ones(2, 3)), ctypes.c_void_p()
    cdrv.expect_failure("aoti_torch_cpu_cumsum", hx, 2, None, ctypes.byref(r0), mentions="dim 2")
    bad = ctypes.c_int32(999)
    cdrv.expect_failure(
        "aoti_torch_cpu_cumsum", hx, 0, ctypes.byref(bad), ctypes.byref(r0), mentions="999"
    )
    assert r0.value is None
    assert cdrv.delete(hx) == 0
