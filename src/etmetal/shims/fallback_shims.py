"""Fallback-op shims (``aoti_torch_cpu_*`` / ``aoti_torch_mps_*``) on ATen over shim storage.

Inputs are ATen views of the shim storage (no copy; ATen packs a view with holes
itself when its kernel needs dense input). An ``out`` tensor that is dense is
written in place; one with holes gets the result computed densely and copied back
through the strided view, so the write is never lost. Ops that return new tensors
hand ATen's result over as an owned storage (no copy).
"""

from __future__ import annotations

import functools
import inspect

import torch

from etmetal.common.fallback_table import all_fallback_shims
from etmetal.shims.abi_codes import DEVICE_CPU, DEVICE_MPS, DTYPE_TO_TORCH
from etmetal.shims.custom_op_shims import CUSTOM_IMPLEMENTATIONS
from etmetal.shims.tensor_shims import adopt_result

from .registry import (
    ShimTable,
    need_out,
    read_f64,
    read_i32s,
    read_i64s,
    read_opt_i64,
    read_ptr,
)
from .storage import ShimError, is_packed

# this module's shims: registered on a context by whoever builds it, never on import
SHIMS = ShimTable()
shim_as = SHIMS.add

aten = torch.ops.aten


def _in(ctx, handle, what: str) -> torch.Tensor:
    return ctx.lookup(handle, what).torch()


def _opt_in(ctx, handle_ptr, what: str) -> torch.Tensor | None:
    handle = read_ptr(handle_ptr, what)
    return None if handle is None else ctx.lookup(handle, what).torch()


def _write_out(ctx, out_handle, expected: tuple[int, ...], dtype: torch.dtype, compute) -> None:
    """Run ``compute(out=...)`` into the shim tensor ``out_handle``, never resizing it."""
    out = ctx.lookup(out_handle, "out")
    o = out.torch()
    if tuple(o.shape) != tuple(expected):
        raise ShimError(f"out has shape {list(o.shape)}, the op produces {list(expected)}")
    if o.dtype != dtype:
        raise ShimError(f"out has dtype {o.dtype}, the op produces {dtype}")
    if is_packed(out.sizes, out.strides):
        compute(o)
    else:
        o.copy_(compute(None))


def _ret(ctx, addr, t: torch.Tensor, what: str, device: int) -> None:
    ctx.emit(addr, adopt_result(t, device), what)


def _for_device(fn, device: int):
    """``fn`` as registered under one C name: an implementation that makes new tensors
    (keyword ``device``) gets the device its name stands for bound now (the cpu names
    make host tensors, the mps names mps tensors of the emulated Metal device).
    ``functools.partial`` adds no Python frame to the call; out-variants need no device."""
    if "device" in inspect.signature(fn).parameters:
        return functools.partial(fn, device=device)
    return fn


def _mm_shape(a: torch.Tensor, b: torch.Tensor, op: str) -> tuple[int, int]:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ShimError(f"{op}: cannot multiply {list(a.shape)} by {list(b.shape)}")
    return (a.shape[0], b.shape[1])


def _bmm_shape(a: torch.Tensor, b: torch.Tensor, op: str) -> tuple[int, int, int]:
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ShimError(f"{op}: cannot batch-multiply {list(a.shape)} by {list(b.shape)}")
    return (a.shape[0], a.shape[1], b.shape[2])


def mm_out(ctx, out, self, mat2):
    a, b = _in(ctx, self, "self"), _in(ctx, mat2, "mat2")
    _write_out(ctx, out, _mm_shape(a, b, "mm"), a.dtype, lambda o: torch.mm(a, b, out=o))


def _scaled_product_plus(op, shape_of, mats: tuple[str, str]):
    """``addmm_out`` / ``baddbmm_out``: ``out = beta * self + alpha * (m1 @ m2)``."""

    def product_out(ctx, out, self, m1, m2, beta, alpha):
        bias, a, b = _in(ctx, self, "self"), _in(ctx, m1, mats[0]), _in(ctx, m2, mats[1])
        _write_out(
            ctx,
            out,
            shape_of(a, b, op.__name__),
            a.dtype,
            lambda o: op(bias, a, b, beta=beta, alpha=alpha, out=o),
        )

    return product_out


addmm_out = _scaled_product_plus(torch.addmm, _mm_shape, ("mat1", "mat2"))
baddbmm_out = _scaled_product_plus(torch.baddbmm, _bmm_shape, ("batch1", "batch2"))


def bmm_out(ctx, out, self, mat2):
    a, b = _in(ctx, self, "self"), _in(ctx, mat2, "mat2")
    _write_out(ctx, out, _bmm_shape(a, b, "bmm"), a.dtype, lambda o: torch.bmm(a, b, out=o))


def topk(ctx, self, k, dim, largest, sorted, ret0, ret1, *, device):
    need_out((ret0, "ret0"), (ret1, "ret1"))
    x = _in(ctx, self, "self")
    if x.dim() and not -x.dim() <= dim < x.dim():
        raise ShimError(f"topk: dim {dim} out of range for a {x.dim()}-d tensor")
    size = x.shape[dim] if x.dim() else 1
    if not 0 <= k <= size:
        raise ShimError(f"topk: k={k} out of range for a dimension of size {size}")
    values, indices = torch.topk(x, k, dim, bool(largest), bool(sorted))
    _ret(ctx, ret0, values, "ret0", device)
    _ret(ctx, ret1, indices, "ret1", device)


def _scan(op, with_dtype: bool):
    """``cumsum`` / ``cumprod`` (optional result dtype) and ``logcumsumexp``: Inductor leaves
    scans over bool/integer inputs, or long ones, to ATen (HF decoders' position ids)."""

    def scan(ctx, self, dim, *rest, device):
        *dtype_ptr, ret0 = rest
        need_out((ret0, "ret0"))
        x = _in(ctx, self, "self")
        if x.dim() and not -x.dim() <= dim < x.dim():
            raise ShimError(f"{op.__name__}: dim {dim} out of range for a {x.dim()}-d tensor")
        kwargs = {}
        if with_dtype:
            code = read_i32s(dtype_ptr[0], 1, "dtype")[0] if dtype_ptr[0] else None
            if code is not None:
                if code not in DTYPE_TO_TORCH:
                    raise ShimError(f"{op.__name__}: unknown dtype code {code}")
                kwargs["dtype"] = DTYPE_TO_TORCH[code]
        _ret(ctx, ret0, op(x, dim, **kwargs), "ret0", device)

    return scan


def _scan_with_indices(op):
    """``cummax`` / ``cummin``: the running extreme and the index it was found at."""

    def scan(ctx, self, dim, ret0, ret1, *, device):
        need_out((ret0, "ret0"), (ret1, "ret1"))
        x = _in(ctx, self, "self")
        if x.dim() and not -x.dim() <= dim < x.dim():
            raise ShimError(f"{op.__name__}: dim {dim} out of range for a {x.dim()}-d tensor")
        values, indices = op(x, dim)
        _ret(ctx, ret0, values, "ret0", device)
        _ret(ctx, ret1, indices, "ret1", device)

    return scan


def convolution(
    ctx,
    input,
    weight,
    bias,
    stride,
    stride_len,
    padding,
    padding_len,
    dilation,
    dilation_len,
    transposed,
    output_padding,
    output_padding_len,
    groups,
    ret0,
    *,
    device,
):
    x, w = _in(ctx, input, "input"), _in(ctx, weight, "weight")
    y = aten.convolution(
        x,
        w,
        _opt_in(ctx, bias, "bias"),
        read_i64s(stride, stride_len, "stride"),
        read_i64s(padding, padding_len, "padding"),
        read_i64s(dilation, dilation_len, "dilation"),
        bool(transposed),
        read_i64s(output_padding, output_padding_len, "output_padding"),
        groups,
    )
    if device == DEVICE_MPS:
        # the layout Inductor compiled against (the wrapper asserts it): the fake mps
        # convolution picks it with the Mps backend's rule, ATen's CPU kernels by theirs
        y = y.contiguous(memory_format=mps_conv_memory_format(x, w))
    _ret(ctx, ret0, y, "ret0", device)


def mps_conv_memory_format(x: torch.Tensor, w: torch.Tensor) -> torch.memory_format:
    """The output layout of an mps convolution, by the rule fake tensors use at compile time."""
    if x.dim() < 4:
        return torch.contiguous_format
    return torch._C._conv_determine_backend_memory_format(x, w, torch._C._ConvBackend.Mps)


def _adaptive_avg_pool(op):
    def adaptive_avg_pool(ctx, self, output_size, output_size_len, ret0, *, device):
        need_out((ret0, "ret0"))
        y = op(_in(ctx, self, "self"), read_i64s(output_size, output_size_len, "output_size"))
        _ret(ctx, ret0, y, "ret0", device)

    return adaptive_avg_pool


def _pool_window(kernel, kernel_len, stride, stride_len, pad, pad_len):
    """A pooling shim's ``kernel_size``, ``stride`` and ``padding`` int arrays."""
    return (
        read_i64s(kernel, kernel_len, "kernel_size"),
        read_i64s(stride, stride_len, "stride"),
        read_i64s(pad, pad_len, "padding"),
    )


def _avg_pool(op):
    """``avg_pool{2,3}d``: Inductor calls ATen's for windows over 25 elements that overlap."""

    def avg_pool(
        ctx,
        self,
        kernel,
        kernel_len,
        stride,
        stride_len,
        pad,
        pad_len,
        ceil,
        count_pad,
        divisor,
        ret0,
        *,
        device,
    ):
        need_out((ret0, "ret0"))
        divisor = read_opt_i64(divisor)
        if divisor == 0:
            raise ShimError(f"{op.__name__}: divisor_override must be non-zero")
        y = op(
            _in(ctx, self, "self"),
            *_pool_window(kernel, kernel_len, stride, stride_len, pad, pad_len),
            bool(ceil),
            bool(count_pad),
            divisor,
        )
        _ret(ctx, ret0, y, "ret0", device)

    return avg_pool


def max_pool2d_with_indices(
    ctx, self, kernel, kernel_len, stride, stride_len, pad, pad_len, dil, dil_len, ceil, ret0, ret1,
    *, device,
):  # fmt: skip
    need_out((ret0, "ret0"), (ret1, "ret1"))
    y, idx = aten.max_pool2d_with_indices(
        _in(ctx, self, "self"),
        *_pool_window(kernel, kernel_len, stride, stride_len, pad, pad_len),
        read_i64s(dil, dil_len, "dilation"),
        bool(ceil),
    )
    _ret(ctx, ret0, y, "ret0", device)
    _ret(ctx, ret1, idx, "ret1", device)


def mkldnn_rnn_layer(
    ctx, input, w0, w1, w2, w3, hx, cx, reverse, batch_sizes, batch_sizes_len, mode, hidden_size,
    num_layers, has_biases, bidirectional, batch_first, train, ret0, ret1, ret2, ret3, *, device,
):  # fmt: skip
    """One LSTM layer: Inductor's CPU decomposition of ``aten.lstm`` calls oneDNN's."""
    outs = ((ret0, "ret0"), (ret1, "ret1"), (ret2, "ret2"), (ret3, "ret3"))
    need_out(*outs)
    if train:
        raise ShimError("mkldnn_rnn_layer: training mode is not supported at inference")
    handles = (input, w0, w1, w2, w3, hx, cx)
    names = ("input", "weight0", "weight1", "weight2", "weight3", "hx_", "cx_")  # ATen's
    results = aten.mkldnn_rnn_layer(
        *(_in(ctx, handle, name) for handle, name in zip(handles, names)),
        bool(reverse),
        list(read_i64s(batch_sizes, batch_sizes_len, "batch_sizes")),
        mode,
        hidden_size,
        num_layers,
        bool(has_biases),
        bool(bidirectional),
        bool(batch_first),
        False,
    )
    for (addr, what), t in zip(outs, results):
        _ret(ctx, addr, t, what, device)


def _qkv(ctx, query, key, value, dropout_p) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An attention shim's query, key and value, checked; dropout (training only) refused."""
    q, k, v = _in(ctx, query, "query"), _in(ctx, key, "key"), _in(ctx, value, "value")
    if dropout_p:
        raise ShimError("attention: dropout is not supported at inference")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ShimError("attention: query, key and value must be 4-d (batch, heads, seq, dim)")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShimError(
            f"attention: incompatible shapes q={list(q.shape)} k={list(k.shape)} v={list(v.shape)}"
        )
    return q, k, v


def sdpa_flash_for_cpu(
    ctx, query, key, value, dropout_p, is_causal, attn_mask, scale, ret0, ret1, *, device
):
    need_out((ret0, "ret0"), (ret1, "ret1"))
    q, k, v = _qkv(ctx, query, key, value, dropout_p)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
        q,
        k,
        v,
        0.0,
        bool(is_causal),
        attn_mask=_opt_in(ctx, attn_mask, "attn_mask"),
        scale=read_f64(scale),
    )
    _ret(ctx, ret0, out, "ret0", device)
    _ret(ctx, ret1, lse, "ret1", device)


def sdpa_math_for_mps(
    ctx, query, key, value, attn_mask, dropout_p, is_causal, dropout_mask, scale, ret0, ret1,
    *, device,
):  # fmt: skip
    sdpa_math_for_mps_v2(
        ctx, query, key, value, attn_mask, dropout_p, is_causal, dropout_mask, scale, 0, ret0, ret1,
        device=device,
    )  # fmt: skip


def sdpa_math_for_mps_v2(
    ctx,
    query,
    key,
    value,
    attn_mask,
    dropout_p,
    is_causal,
    dropout_mask,
    scale,
    enable_gqa,
    ret0,
    ret1,
    *,
    device,
):
    need_out((ret0, "ret0"), (ret1, "ret1"))
    q, k, v = _qkv(ctx, query, key, value, dropout_p)
    out, attn = aten._scaled_dot_product_attention_math(
        q,
        k,
        v,
        _opt_in(ctx, attn_mask, "attn_mask"),
        0.0,
        bool(is_causal),
        None,  # dropout is refused above, so there is no mask to apply
        scale=read_f64(scale),
        # upstream derives the group factor from the shapes
        enable_gqa=bool(enable_gqa) or q.shape[1] != k.shape[1],
    )
    _ret(ctx, ret0, out, "ret0", device)
    _ret(ctx, ret1, attn, "ret1", device)


# one implementation per fallback op, registered under its name on every device whose
# target lists it in etmetal.common.fallback_table (a test checks both sides cover each other)
IMPLEMENTATIONS = {
    "mm_out": mm_out,
    "addmm_out": addmm_out,
    "bmm_out": bmm_out,
    "baddbmm_out": baddbmm_out,
    "topk": topk,
    "convolution": convolution,
    "_adaptive_avg_pool2d": _adaptive_avg_pool(aten._adaptive_avg_pool2d),
    "_adaptive_avg_pool3d": _adaptive_avg_pool(aten._adaptive_avg_pool3d),
    "max_pool2d_with_indices": max_pool2d_with_indices,
    "avg_pool2d": _avg_pool(aten.avg_pool2d),
    "avg_pool3d": _avg_pool(aten.avg_pool3d),
    "mkldnn_rnn_layer": mkldnn_rnn_layer,
    "cumsum": _scan(torch.cumsum, with_dtype=True),
    "cumprod": _scan(torch.cumprod, with_dtype=True),
    "logcumsumexp": _scan(torch.logcumsumexp, with_dtype=False),
    "cummax": _scan_with_indices(torch.cummax),
    "cummin": _scan_with_indices(torch.cummin),
    "_scaled_dot_product_flash_attention_for_cpu": sdpa_flash_for_cpu,
    "_scaled_dot_product_attention_math_for_mps": sdpa_math_for_mps,
    "_scaled_dot_product_attention_math_for_mps_v2": sdpa_math_for_mps_v2,
    **CUSTOM_IMPLEMENTATIONS,  # torchao's int4 linear, metal::gather_qmv, gated_delta_rule
}
for _symbol, _op in all_fallback_shims().items():
    _device = DEVICE_MPS if _symbol.startswith("aoti_torch_mps_") else DEVICE_CPU
    shim_as(_symbol, _for_device(IMPLEMENTATIONS[_op], _device))
