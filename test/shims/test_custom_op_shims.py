"""The custom operators' shims, called as a ``.so`` calls them: torchao's int4 linear
against torchao's reference, ``metal::gather_qmv`` and ``metal::gated_delta_rule`` against
ExecuTorch's CPU references, and bad arguments refused with the operator named."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from executorch.backends.apple.metal.ops.gather_qmv import _quantize_int4_affine

from etmetal.shims import last_error

UINT8, INT32 = 0, 3
CODES = {torch.float32: 6, torch.uint8: UINT8, torch.int32: INT32}


def _h(cdrv, t: torch.Tensor) -> int:
    """A shim tensor holding a copy of ``t`` (any of the dtypes above)."""
    h = cdrv.empty(tuple(t.shape), tuple(t.stride()), dtype=CODES[t.dtype])
    cdrv.write(h, t.numpy())
    return h


def _read(cdrv, h: int) -> torch.Tensor:
    return torch.from_numpy(cdrv.read(h, np.float32))


def _torchao_reference(a, q, group_size, scales, zeros, dtype=torch.float32):
    """torchao's test reference: weights dequantized by group (in float32), then one
    matmul, carried out in ``dtype``."""
    n, k = q.shape
    s = scales.unsqueeze(2).repeat(1, 1, group_size).view(n, -1)[:, :k]
    z = zeros.unsqueeze(2).repeat(1, 1, group_size).view(n, -1)[:, :k]
    return torch.mm(a.to(dtype), (s * q.float() + z).t().to(dtype))


def _assert_matches_torchao(got, a, q, group_size, scales, zeros):
    """Within the delegate tests' tolerance of torchao's float32 reference, and at least as
    close as it is to the exact product of A and the same float32-dequantized weights
    (float32 matmuls differ from each other by their summation order, so the float64
    product is the one fixed point)."""
    ref = _torchao_reference(a, q, group_size, scales, zeros)
    exact = _torchao_reference(a, q, group_size, scales, zeros, torch.float64)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    err_got = (got.double() - exact).abs().max().item()
    err_ref = (ref.double() - exact).abs().max().item()
    assert err_got <= err_ref + 1e-9 * exact.abs().max().item(), (err_got, err_ref)


def _int4_case(m=3, k=64, n=8, group_size=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    groups = -(-k // group_size)  # a partial last group when group_size does not divide K
    scales = torch.rand(n, groups, generator=gen) + 0.01
    zeros = -torch.randint(0, 16, (n, groups), generator=gen).float() * scales
    a = torch.rand(m, k, generator=gen)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)  # torchao's 4-bit layout, written out
    return a, q, packed, scales, zeros


@pytest.mark.parametrize("device", ["cpu", "mps"])
@pytest.mark.parametrize(
    "m, k, n, group_size",
    [
        (3, 64, 8, 32),
        (1, 32, 3, 32),
        (5, 256, 12, 128),
        (1, 640, 1030, 32),  # the registry's one-row (qmv) module
        (127, 128, 256, 64),
        (2, 40, 4, 32),  # a partial last group
        (4, 512, 8, 256),
    ],
)
def test_int4_linear_matches_torchao_reference(cdrv, device, m, k, n, group_size):
    a, q, packed, scales, zeros = _int4_case(m, k, n, group_size)
    hs = [_h(cdrv, t) for t in (a, packed)]
    hsz = [_h(cdrv, t) for t in (scales, zeros)]
    ret = ctypes.c_void_p()
    fn = getattr(cdrv.lib, f"aoti_torch_{device}__linear_fp_act_4bit_weight")
    assert fn(*hs, group_size, *hsz, ctypes.byref(ret)) == 0, last_error()
    _assert_matches_torchao(_read(cdrv, ret.value), a, q, group_size, scales, zeros)
    for h in (*hs, *hsz, ret.value):
        assert cdrv.delete(h) == 0


def test_int4_linear_never_expands_the_weights(cdrv, monkeypatch):
    # the shim computes from the packed bytes: the reference's whole-matrix dequantize and
    # unpack are never called (they would make an [N, K] float32 copy per call)
    from etmetal.common import lowbit

    def expand(*args, **kwargs):
        raise AssertionError("the int4 shim expanded the weight matrix")

    monkeypatch.setattr(lowbit, "dequantize", expand)
    monkeypatch.setattr(lowbit, "unpack", expand)
    a, q, packed, scales, zeros = _int4_case(1, 640, 1030, 32)
    hs = [_h(cdrv, t) for t in (a, packed, scales, zeros)]
    ret = ctypes.c_void_p()
    fn = cdrv.lib.aoti_torch_cpu__linear_fp_act_4bit_weight
    assert fn(hs[0], hs[1], 32, hs[2], hs[3], ctypes.byref(ret)) == 0, last_error()
    _assert_matches_torchao(_read(cdrv, ret.value), a, q, 32, scales, zeros)
    for h in (*hs, ret.value):
        assert cdrv.delete(h) == 0


def test_int4_linear_refuses_weights_of_the_wrong_width(cdrv):
    a, _, packed, scales, zeros = _int4_case()
    hs = [_h(cdrv, t) for t in (a, packed[:, :-1].contiguous(), scales, zeros)]
    ret = ctypes.c_void_p()
    name = "aoti_torch_cpu__linear_fp_act_4bit_weight"
    cdrv.expect_failure(name, hs[0], hs[1], 32, hs[2], hs[3], ctypes.byref(ret), mentions="K=64")
    assert ret.value is None
    for h in hs:
        assert cdrv.delete(h) == 0


def _gather_case(p=5, experts=3, n=16, k=64, group_size=32):
    gen = torch.Generator().manual_seed(1)
    w, scales, biases = _quantize_int4_affine(torch.randn(experts, n, k, generator=gen), group_size)
    x = torch.randn(p, k, generator=gen)
    idx = torch.tensor([2, 0, 1, 2, 0][:p], dtype=torch.int32)
    return x, w, scales, biases, idx


def test_gather_qmv_matches_the_executorch_reference(cdrv):
    x, w, s, b, idx = _gather_case()
    hs = [_h(cdrv, t) for t in (x, w, s, b, idx)]
    ret = ctypes.c_void_p()
    assert cdrv.lib.aoti_torch_cpu_gather_qmv(*hs, 32, ctypes.byref(ret)) == 0, last_error()
    # each row times its expert's dequantized weights (torchao-style affine int4)
    want = torch.stack(
        [
            (
                torch.stack((w[e] & 0xF, w[e] >> 4), -1).reshape(16, 64).float()
                * s[e].repeat_interleave(32, 1)
                + b[e].repeat_interleave(32, 1)
            )
            @ x[i]
            for i, e in enumerate(idx.tolist())
        ]
    )
    torch.testing.assert_close(_read(cdrv, ret.value), want, atol=1e-4, rtol=1e-4)
    for h in (*hs, ret.value):
        assert cdrv.delete(h) == 0


def test_gather_qmv_refuses_an_expert_index_out_of_range(cdrv):
    x, w, s, b, _ = _gather_case()
    bad = torch.tensor([0, 1, 3, 0, 1], dtype=torch.int32)  # 3 experts: index 3 is past the end
    hs = [_h(cdrv, t) for t in (x, w, s, b, bad)]
    ret = ctypes.c_void_p()
    msg = cdrv.expect_failure(
        "aoti_torch_mps_gather_qmv", *hs, 32, ctypes.byref(ret), mentions="expert index"
    )
    assert "metal::gather_qmv" in msg and ret.value is None
    for h in hs:
        assert cdrv.delete(h) == 0


def _delta_case(hk=2, hv=4):
    gen = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 3, hk, 8, generator=gen) for _ in range(2))
    v = torch.randn(1, 3, hv, 8, generator=gen)
    g = torch.rand(1, 3, hv, generator=gen)
    beta = torch.rand(1, 3, hv, generator=gen)
    state = torch.randn(1, hv, 8, 8, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_gated_delta_rule_returns_y_and_writes_the_state(cdrv, device):
    from executorch.backends.apple.metal.ops.gated_delta_rule import gated_delta_rule

    q, k, v, g, beta, state = _delta_case()
    hs = [_h(cdrv, t) for t in (q, k, v, g, beta, state)]
    ret = ctypes.c_void_p()
    fn = getattr(cdrv.lib, f"aoti_torch_{device}_gated_delta_rule")
    assert fn(*hs, ctypes.byref(ret)) == 0, last_error()
    want_state = state.clone()
    want_y = gated_delta_rule(q, k, v, g, beta, want_state)
    torch.testing.assert_close(_read(cdrv, ret.value), want_y)
    torch.testing.assert_close(_read(cdrv, hs[5]), want_state)  # written in place
    assert not torch.equal(want_state, state)
    for h in (*hs, ret.value):
        assert cdrv.delete(h) == 0


def test_gated_delta_rule_refuses_a_state_of_the_wrong_shape(cdrv):
    q, k, v, g, beta, state = _delta_case()
    hs = [_h(cdrv, t) for t in (q, k, v, g, beta, state[:, :3].contiguous())]
    ret = ctypes.c_void_p()
    msg = cdrv.expect_failure(
        "aoti_torch_cpu_gated_delta_rule", *hs, ctypes.byref(ret), mentions="StateIn"
    )
    assert "metal::gated_delta_rule" in msg
    for h in hs:
        assert cdrv.delete(h) == 0


def _perturb(rng, t: torch.Tensor) -> torch.Tensor:
    """``t`` with one thing wrong: its dtype or its rank."""
    if rng.random() < 0.5:
        return t.to(torch.int32 if t.is_floating_point() else torch.float32)
    return t.unsqueeze(0)


@pytest.mark.parametrize("seed", range(12))
def test_custom_shims_refuse_malformed_arguments_cleanly(cdrv, seed):
    """One argument made wrong at random (or the output pointer NULL, or a dead handle):
    the call returns an error naming the operator, leaks nothing, never crashes."""
    import random

    rng = random.Random(seed)
    a, _, packed, scales, zeros = _int4_case()
    x, w, s, b, idx = _gather_case()
    cases = {
        "aoti_torch_cpu__linear_fp_act_4bit_weight": ([a, packed, 32, scales, zeros], "4bit"),
        "aoti_torch_mps_gather_qmv": ([x, w, s, b, idx, 32], "metal::gather_qmv"),
        "aoti_torch_cpu_gated_delta_rule": (list(_delta_case()), "metal::gated_delta_rule"),
    }
    name = rng.choice(sorted(cases))
    args, mentions = cases[name]
    tensors = [i for i, v in enumerate(args) if isinstance(v, torch.Tensor)]
    how = rng.choice(["tensor", "tensor", "tensor", "null_ret", "dead_handle", "group"])
    if how == "group" and 32 in args:
        args[args.index(32)] = rng.choice([0, -32, 48, 1 << 40])
    elif how == "tensor" or how == "group":
        i = rng.choice(tensors)
        args[i] = _perturb(rng, args[i])
    handles = {i: _h(cdrv, args[i]) for i in tensors}
    c_args = [handles.get(i, v) for i, v in enumerate(args)]
    if how == "dead_handle":
        victim = rng.choice(tensors)
        assert cdrv.delete(handles.pop(victim)) == 0
    ret = ctypes.c_void_p()
    out = None if how == "null_ret" else ctypes.byref(ret)
    cdrv.expect_failure(name, *c_args, out, mentions="")
    assert ret.value is None
    if how != "dead_handle":
        assert mentions in last_error() or "NULL" in last_error(), last_error()
    for h in handles.values():
        assert cdrv.delete(h) == 0
