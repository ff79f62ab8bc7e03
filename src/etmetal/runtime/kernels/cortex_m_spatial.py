"""``cortex_m::`` convolution and pooling kernels (NCHW-logical and explicit ``_nhwc`` forms).

Weights arrive in the layouts the Cortex-M lowering stores them in: OHWI for
convolutions, IHWO ([1, kh, kw, C_out]) for depthwise ones. Accumulation is in
exact integers (int32 with wrap-around, as the C kernels), requantization per
output channel in one broadcast pass. Pooling follows the reference model:
average pooling through the dequantized values, max pooling on the int8 values.

The ``_nhwc`` variants take and produce logically NHWC tensors; they run the
same arithmetic on a permuted view.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from etmetal.runtime.kernels.cmsis_math import (
    channel_view,
    fixed_point_scale,
    requantize,
    wrap_int32,
)
from etmetal.runtime.kernels.cortex_m_common import (
    CortexMKernelError,
    expect,
    saturate_int8,
    write_out,
)
from etmetal.runtime.kernels.registry import register_kernel


def _pair(op: str, name: str, value) -> tuple[int, int]:
    items = [int(v) for v in value]
    if len(items) == 1:
        items *= 2
    if len(items) != 2:
        raise CortexMKernelError(op, f"{name} must have 1 or 2 entries, got {list(value)}")
    return items[0], items[1]


def _bias(op: str, bias, channels: int) -> torch.Tensor | None:
    if bias is None:
        return None
    expect(op, "bias", bias, (torch.int32,))
    if bias.numel() != channels:
        raise CortexMKernelError(
            op, f"bias has {bias.numel()} entries for {channels} output channels"
        )
    return bias.reshape(1, channels, 1, 1)


def _requantize_channels(op, acc, multipliers, shifts, output_offset, act_min, act_max):
    channels = acc.shape[1]
    mult = channel_view(multipliers, channels, 1, acc.dim(), op)
    shift = channel_view(shifts, channels, 1, acc.dim(), op)
    return saturate_int8(requantize(acc, mult, shift) + output_offset, act_min, act_max)


def _finish(op, acc, bias, channels, multipliers, shifts, output_offset, act_min, act_max):
    """The int32 accumulator plus the per-channel bias (if any), requantized to int8."""
    bias = _bias(op, bias, channels)
    if bias is not None:
        acc = acc + bias
    return _requantize_channels(op, acc, multipliers, shifts, output_offset, act_min, act_max)


def _conv_geometry(op, stride, padding, dilation):
    stride, padding, dilation = (
        _pair(op, "stride", stride),
        _pair(op, "padding", padding),
        _pair(op, "dilation", dilation),
    )
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise CortexMKernelError(
            op, f"invalid stride {stride}, padding {padding} or dilation {dilation}"
        )
    return stride, padding, dilation


def _integer_conv2d(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, groups):
    """Exact int32 convolution (wrap-around like the C accumulators)."""
    if dilation == (1, 1):
        return F.conv2d(x, w, stride=stride, padding=padding, groups=groups)
    # aten has no dilated integer convolution; float64 holds every int32 sum exactly
    acc = F.conv2d(
        x.to(torch.float64), w.to(torch.float64),
        stride=stride, padding=padding, dilation=dilation, groups=groups,
    )  # fmt: skip
    return wrap_int32(acc.to(torch.int64))


def conv2d(op, input, weight, bias, stride, padding, dilation, input_offset, output_offset,
           multipliers, shifts, act_min, act_max) -> torch.Tensor:  # fmt: skip
    """arm_convolve_s8 on an NCHW-logical input and an OHWI weight."""
    expect(op, "input", input, (torch.int8,), ndim=4)
    expect(op, "weight", weight, (torch.int8,), ndim=4)
    in_channels, kernel_channels = input.shape[1], weight.shape[3]
    if (
        kernel_channels == 0
        or in_channels % kernel_channels
        or weight.shape[0] % (in_channels // kernel_channels)
    ):
        raise CortexMKernelError(
            op, f"weight {list(weight.shape)} (OHWI) does not fit input {list(input.shape)}"
        )
    stride, padding, dilation = _conv_geometry(op, stride, padding, dilation)
    acc = _integer_conv2d(
        input.to(torch.int32) + int(input_offset),
        weight.to(torch.int32).permute(0, 3, 1, 2),
        stride, padding, dilation, in_channels // kernel_channels,
    )  # fmt: skip
    return _finish(
        op, acc, bias, weight.shape[0], multipliers, shifts, output_offset, act_min, act_max
    )


def depthwise_conv2d(op, input, weight, bias, stride, padding, dilation, depth_multiplier,
                     input_offset, output_offset, multipliers, shifts, act_min, act_max):  # fmt: skip
    """arm_depthwise_conv_s8 on an NCHW-logical input and an IHWO weight."""
    expect(op, "input", input, (torch.int8,), ndim=4)
    expect(op, "weight", weight, (torch.int8,), ndim=4)
    channels, out_channels = input.shape[1], weight.shape[3]
    if weight.shape[0] != 1 or out_channels != channels * int(depth_multiplier):
        raise CortexMKernelError(
            op,
            f"weight {list(weight.shape)} (IHWO) does not fit input {list(input.shape)} "
            f"with depth_multiplier {depth_multiplier}",
        )
    stride, padding, dilation = _conv_geometry(op, stride, padding, dilation)
    x = input.to(torch.int32) + int(input_offset)
    if out_channels != channels:  # output channel c reads input channel c // depth_multiplier
        x = x.repeat_interleave(int(depth_multiplier), dim=1)
    # padding contributes nothing (it is added after the input offset)
    x = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    kh, kw = weight.shape[1], weight.shape[2]
    out_h = (x.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    out_w = (x.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if out_h <= 0 or out_w <= 0:
        raise CortexMKernelError(op, f"kernel {kh}x{kw} does not fit input {list(input.shape)}")
    # one multiply-accumulate per kernel tap over the whole tensor: exact int32 arithmetic
    # (aten's grouped integer convolution is slow, and float would need a size argument)
    taps = weight.to(torch.int32).reshape(kh, kw, 1, out_channels, 1, 1)
    acc = torch.zeros(x.shape[0], out_channels, out_h, out_w, dtype=torch.int32)
    for i in range(kh):
        for j in range(kw):
            top, left = i * dilation[0], j * dilation[1]
            window = x[
                :, :,
                top : top + stride[0] * (out_h - 1) + 1 : stride[0],
                left : left + stride[1] * (out_w - 1) + 1 : stride[1],
            ]  # fmt: skip
            acc += window * taps[i, j]
    return _finish(
        op, acc, bias, out_channels, multipliers, shifts, output_offset, act_min, act_max
    )


def transpose_conv2d(op, input, weight, bias, stride, padding, output_padding, dilation,
                     input_offset, output_offset, multipliers, shifts, act_min, act_max):  # fmt: skip
    """arm_transpose_conv_s8 on an NCHW-logical input and an OHWI weight."""
    expect(op, "input", input, (torch.int8,), ndim=4)
    expect(op, "weight", weight, (torch.int8,), ndim=4)
    in_channels, kernel_channels = input.shape[1], weight.shape[3]
    if kernel_channels == 0 or in_channels % kernel_channels:
        raise CortexMKernelError(
            op, f"weight {list(weight.shape)} (OHWI) does not fit input {list(input.shape)}"
        )
    stride, padding, dilation = _conv_geometry(op, stride, padding, dilation)
    output_padding = _pair(op, "output_padding", output_padding)
    # torch has no integer transposed convolution; float64 holds every int32 sum exactly
    acc = F.conv_transpose2d(
        (input.to(torch.int32) + int(input_offset)).to(torch.float64),
        weight.to(torch.float64).permute(3, 0, 1, 2),
        stride=stride, padding=padding, output_padding=output_padding,
        dilation=dilation, groups=in_channels // kernel_channels,
    )  # fmt: skip
    acc = wrap_int32(acc.to(torch.int64))
    return _finish(
        op, acc, bias, weight.shape[0], multipliers, shifts, output_offset, act_min, act_max
    )


def avg_pool2d(op, input, kernel_size, stride, padding, ceil_mode, zero_point, multiplier, shift):
    """Average pooling as the reference model computes it: dequantize, average
    (padding excluded from the count), requantize with round-half-even."""
    expect(op, "input", input, (torch.int8,), ndim=4)
    scale = fixed_point_scale(multiplier, shift)
    if not scale > 0:
        raise CortexMKernelError(op, f"multiplier {multiplier} / shift {shift} give scale {scale}")
    kernel, stride, padding = (
        _pair(op, "kernel_size", kernel_size),
        _pair(op, "stride", stride),
        _pair(op, "padding", padding),
    )
    if padding[0] * 2 > kernel[0] or padding[1] * 2 > kernel[1]:
        raise CortexMKernelError(op, f"padding {padding} exceeds half the kernel {kernel}")
    values = (input.float() - zero_point) * scale
    pooled = F.avg_pool2d(
        values, kernel, stride=stride, padding=padding, ceil_mode=bool(ceil_mode),
        count_include_pad=False,
    )  # fmt: skip
    return saturate_int8(torch.round(pooled / scale) + zero_point)


def max_pool2d(op, input, kernel_size, stride, padding, dilation, ceil_mode,
               input_zero_point, output_zero_point, act_min, act_max):  # fmt: skip
    """arm_max_pool_s8: the int8 maximum of each window, clamped to the activation range."""
    expect(op, "input", input, (torch.int8,), ndim=4)
    if input_zero_point != output_zero_point:
        raise CortexMKernelError(
            op, f"input and output zero points differ ({input_zero_point} vs {output_zero_point})"
        )
    kernel, stride, padding = (
        _pair(op, "kernel_size", kernel_size),
        _pair(op, "stride", stride),
        _pair(op, "padding", padding),
    )
    if _pair(op, "dilation", dilation) != (1, 1):
        raise CortexMKernelError(op, f"only dilation 1 is supported, got {list(dilation)}")
    if ceil_mode:
        raise CortexMKernelError(op, "ceil_mode=True is not supported")
    if padding[0] * 2 > kernel[0] or padding[1] * 2 > kernel[1]:
        raise CortexMKernelError(op, f"padding {padding} exceeds half the kernel {kernel}")
    # aten's channels-last int8 max pool caps the image size: pool an NCHW copy
    pooled = F.max_pool2d(
        input.to(memory_format=torch.contiguous_format),
        kernel,
        stride=stride,
        padding=padding,
        ceil_mode=False,
    )
    return torch.clamp(pooled, act_min, act_max).to(torch.int8)


def _nchw(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 3, 1, 2)


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 2, 3, 1)


def _register(name: str, compute: Callable[..., torch.Tensor], n_args: int, nhwc: bool) -> None:
    op = f"cortex_m::{name}.out"

    def kernel(*args) -> None:
        if len(args) != n_args + 1:
            raise CortexMKernelError(op, f"expects {n_args} arguments and out, got {len(args)}")
        *inputs, out = args
        if nhwc:
            x = expect(op, "input", inputs[0], ndim=4)
            # logically NHWC tensors: compute on the NCHW view, store back through it
            result = _nhwc(compute(op, _nchw(x).contiguous(), *inputs[1:]))
        else:
            result = compute(op, *inputs)
        write_out(op, out, result)

    kernel.__name__ = kernel.__qualname__ = f"{name}_out"
    register_kernel(op, num_returns=1)(kernel)


def _drop_scratch(compute, n_scratch: int):
    # scratch buffers are CMSIS working memory; the host computation needs none
    def wrapped(op, *args):
        return compute(op, *args[: len(args) - n_scratch])

    return wrapped


_SPATIAL = {
    # name: (compute, argument count without out, trailing scratch tensors)
    "quantized_conv2d": (conv2d, 13, 1),
    "quantized_depthwise_conv2d": (depthwise_conv2d, 14, 1),
    "quantized_transpose_conv2d": (transpose_conv2d, 15, 2),
    "quantized_avg_pool2d": (avg_pool2d, 9, 1),
    "quantized_max_pool2d": (max_pool2d, 10, 0),
}

for _name, (_compute, _n_args, _n_scratch) in _SPATIAL.items():
    _fn = _drop_scratch(_compute, _n_scratch) if _n_scratch else _compute
    _register(_name, _fn, _n_args, nhwc=False)
    _register(f"{_name}_nhwc", _fn, _n_args, nhwc=True)
