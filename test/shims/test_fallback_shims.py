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
