"""The custom operators' shims: torchao's int4 linear and upstream's two Metal ops.

Names and C signatures are upstream's (see ``etmetal.common.custom_ops``); each is served
on the ``cpu`` prefix (``host``) and the ``mps`` prefix (the emulated Metal device), and
``fallbacks`` registers them with the other fallbacks. Arguments are views of the shim
storage, so the packed int4 weights are read where the weights blob holds them, never
expanded at load; ``gated_delta_rule`` writes the new state through its ``StateIn`` view.

The numerics are the references: torchao's (dequantize by group, then one matmul,
``etmetal.common.lowbit``; the int4 shim computes it group by group from the packed bytes
in native code, :mod:`.int4_kernel`) and ExecuTorch's CPU implementations of the
``metal::`` ops.
Arguments are checked first, so bad shapes, dtypes or expert indices fail with a message
naming the operator instead of indexing out of bounds.
"""

from __future__ import annotations

import importlib

import torch

from etmetal.shims import int4_kernel as int4_kernel
from etmetal.shims.tensor_shims import adopt_result

from .registry import need_out
from .storage import ShimError

_METAL_OPS = "executorch.backends.apple.metal.ops"


def _in(ctx, handle, what: str) -> torch.Tensor:
    return ctx.lookup(handle, what).torch()


def _ret(ctx, addr, t: torch.Tensor, what: str, device: int) -> None:
    ctx.emit(addr, adopt_result(t, device), what)


def _metal_op(name: str):
    """``torch.ops.metal.<name>``, registered by ExecuTorch's reference module."""
    try:
        importlib.import_module(f"{_METAL_OPS}.{name}")
    except ImportError as exc:
        raise ShimError(f"metal::{name} needs ExecuTorch's {_METAL_OPS}.{name} ({exc})") from exc
    return getattr(torch.ops.metal, name)


def _require(cond: bool, op: str, message: str) -> None:
    if not cond:
        raise ShimError(f"{op}: {message}")


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def linear_fp_act_4bit_weight(ctx, a, b, group_size, s, z, ret, *, device: int):
    need_out((ret, "ret"))
    args = (_in(ctx, a, "A"), _in(ctx, b, "B"), group_size, _in(ctx, s, "S"), _in(ctx, z, "Z"))
    try:
        y = int4_kernel.linear_4bit(*args)
    except ValueError as exc:
        raise ShimError(str(exc)) from exc
    _ret(ctx, ret, y, "ret", device)


def gather_qmv(ctx, x, w, s, z, expert_indices, group_size, ret, *, device: int):
    op = "metal::gather_qmv"
    need_out((ret, "ret"))
    xt, wt = _in(ctx, x, "X"), _in(ctx, w, "W")
    st, zt = _in(ctx, s, "S"), _in(ctx, z, "Z")
    idx = _in(ctx, expert_indices, "ExpertIndices")
    _require(xt.dim() == 2 and xt.is_floating_point(), op, f"X must be 2-d float, got {xt.dtype}")
    _require(wt.dim() == 3 and wt.dtype == torch.uint8, op, f"W must be 3-d uint8, got {wt.dtype}")
    p, k = xt.shape
    e, n, k_packed = wt.shape
    _require(k_packed * 2 == k, op, f"W {_shape(wt)} packs K={k_packed * 2}, X has K={k}")
    _require(group_size > 0 and k % group_size == 0, op, f"group_size {group_size} vs K={k}")
    for name, t in (("S", st), ("Z", zt)):
        want = [e, n, k // group_size]
        _require(_shape(t) == want, op, f"{name} must be {want}, got {_shape(t)}")
        _require(t.is_floating_point(), op, f"{name} must be floating point, got {t.dtype}")
    _require(
        idx.dim() == 1 and idx.shape[0] == p and not idx.is_floating_point(),
        op,
        f"ExpertIndices must be {p} integers, got {idx.dtype} {_shape(idx)}",
    )
    if p:
        low, high = int(idx.min()), int(idx.max())
        _require(low >= 0 and high < e, op, f"expert index out of range [0, {e}): {low}..{high}")
    _ret(ctx, ret, _metal_op("gather_qmv")(xt, wt, st, zt, idx, group_size), "ret", device)


def gated_delta_rule(ctx, q, k, v, g, beta, state, ret_y, *, device: int):
    op = "metal::gated_delta_rule"
    need_out((ret_y, "retY"))
    qt, kt, vt = _in(ctx, q, "Q"), _in(ctx, k, "K"), _in(ctx, v, "V")
    gt, bt, st = _in(ctx, g, "G"), _in(ctx, beta, "Beta"), _in(ctx, state, "StateIn")
    _require(qt.dim() == 4 and _shape(kt) == _shape(qt), op, "Q and K must be [B, T, Hk, Dk]")
    bsz, steps, hk, dk = qt.shape
    _require(vt.dim() == 4 and _shape(vt)[:2] == [bsz, steps], op, "V must be [B, T, Hv, Dv]")
    hv, dv = vt.shape[2:]
    _require(hk > 0 and hv % hk == 0, op, f"value heads {hv} not a multiple of key heads {hk}")
    for name, t in (("G", gt), ("Beta", bt)):
        _require(_shape(t) == [bsz, steps, hv], op, f"{name} must be {[bsz, steps, hv]}")
    _require(_shape(st) == [bsz, hv, dv, dk], op, f"StateIn must be {[bsz, hv, dv, dk]}")
    for name, t in (("Q", qt), ("K", kt), ("V", vt), ("G", gt), ("Beta", bt), ("StateIn", st)):
        _require(t.is_floating_point(), op, f"{name} must be floating point, got {t.dtype}")
    # the reference writes the final state into ``st``, a view of StateIn's storage
    y = _metal_op("gated_delta_rule")(qt, kt, vt, gt, bt, st)
    _ret(ctx, ret_y, y, "retY", device)


# op name (as in etmetal.common.fallback_table) -> implementation
CUSTOM_IMPLEMENTATIONS = {
    "_linear_fp_act_4bit_weight": linear_fp_act_4bit_weight,
    "gather_qmv": gather_qmv,
    "gated_delta_rule": gated_delta_rule,
}
