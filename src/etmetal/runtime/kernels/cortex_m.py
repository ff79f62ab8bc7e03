"""Reference kernels for ExecuTorch's ``cortex_m::`` operators, so Cortex-M programs run on a host.

The arithmetic follows the Python reference implementations ExecuTorch ships
with the Cortex-M backend (``executorch/backends/cortex_m/ops/operators.py``),
which model the CMSIS-NN kernels: int32 accumulation, ``arm_nn_requantize``
rounding, then saturation to the activation range. Every kernel is written with
whole-tensor torch ops (per-channel parameters broadcast, no Python loops over
elements or channels) and writes its result into the planned ``out`` tensor,
whatever that tensor's dim order.

Importing this module registers every ``cortex_m::*.out`` kernel, including the
convolution and pooling ones defined in ``cortex_m_spatial``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from etmetal.runtime.kernels.cmsis_math import ADD_LEFT_SHIFT, requantize, wrap_int32
from etmetal.runtime.kernels.cortex_m_common import (
    CortexMKernelError,
    expect,
    saturate_int8,
    scalar_type,
    write_out,
)
from etmetal.runtime.kernels.registry import register_kernel

# The softmax kernel reads its input as Q5.26 (5 integer bits) and writes int8
# probabilities with scale 1/256 and zero point -128 (CMSIS-NN's fixed choice).
_SOFTMAX_INPUT_INTEGER_BITS = 5
_SOFTMAX_OUTPUT_SCALE = 1.0 / 256.0
_SOFTMAX_OUTPUT_ZERO_POINT = -128

_QUANT_BOUNDS = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
}


def _same_or_channel_broadcast(op: str, a: torch.Tensor, b: torch.Tensor) -> None:
    # The lowering only emits equal shapes or a per-channel operand ([1, C, 1, 1]-like)
    if a.shape == b.shape:
        return
    if a.dim() == b.dim() and a.dim() >= 2 and a.size(1) == b.size(1):  # noqa: SIM102
        if a.numel() == a.size(1) or b.numel() == b.size(1):
            return
    raise CortexMKernelError(
        op,
        f"operands must have equal shapes or one must be per-channel; got "
        f"{list(a.shape)} and {list(b.shape)}",
    )


# ---------------------------------------------------------------- quantize / dequantize


@register_kernel("cortex_m::quantize_per_tensor.out", num_returns=1)
def quantize_per_tensor_out(input, scale, zero_point, quant_min, quant_max, dtype, out) -> None:
    op = "cortex_m::quantize_per_tensor.out"
    expect(op, "input", input, (torch.float32, torch.float16, torch.bfloat16))
    target = scalar_type(op, dtype)
    low, high = _QUANT_BOUNDS.get(target, (None, None))
    if low is None or quant_min < low or quant_max > high or quant_min > quant_max:
        raise CortexMKernelError(
            op, f"quant range [{quant_min}, {quant_max}] is not valid for {target}"
        )
    if not scale > 0:
        raise CortexMKernelError(op, f"scale must be positive, got {scale}")
    values = input.to(torch.float32)
    inv_scale = 1.0 / scale
    result = torch.clamp(torch.round(values * inv_scale) + zero_point, quant_min, quant_max)
    write_out(op, out, result.to(target))


@register_kernel("cortex_m::dequantize_per_tensor.out", num_returns=1)
def dequantize_per_tensor_out(input, scale, zero_point, quant_min, quant_max, dtype, out) -> None:
    op = "cortex_m::dequantize_per_tensor.out"
    source = scalar_type(op, dtype)
    expect(op, "input", input, (source,))
    expect(op, "out", out, (torch.float32,))
    write_out(op, out, (input.to(torch.float32) - zero_point) * scale)


# ---------------------------------------------------------------- elementwise


@register_kernel("cortex_m::quantized_add.out", num_returns=1)
def quantized_add_out(
    self, self_zero_point, self_multiplier, self_shift,
    other, other_zero_point, other_multiplier, other_shift,
    output_zero_point, output_multiplier, output_shift,
    activation_min, activation_max, out,
) -> None:  # fmt: skip
    op = "cortex_m::quantized_add.out"
    expect(op, "self", self, (torch.int8,))
    expect(op, "other", other, (torch.int8,))
    _same_or_channel_broadcast(op, self, other)
    # arm_elementwise_add_s8: lift both operands to a common scale, add, rescale
    a = requantize(
        (self.to(torch.int32) - self_zero_point) << ADD_LEFT_SHIFT, self_multiplier, self_shift
    )
    b = requantize(
        (other.to(torch.int32) - other_zero_point) << ADD_LEFT_SHIFT, other_multiplier, other_shift
    )
    summed = requantize(a + b, output_multiplier, output_shift)
    write_out(op, out, saturate_int8(summed + output_zero_point, activation_min, activation_max))


@register_kernel("cortex_m::quantized_mul.out", num_returns=1)
def quantized_mul_out(
    self, self_zero_point, other, other_zero_point,
    output_zero_point, output_multiplier, output_shift, out,
) -> None:  # fmt: skip
    op = "cortex_m::quantized_mul.out"
    expect(op, "self", self, (torch.int8,))
    expect(op, "other", other, (torch.int8,))
    _same_or_channel_broadcast(op, self, other)
    product = (self.to(torch.int32) - self_zero_point) * (other.to(torch.int32) - other_zero_point)
    scaled = requantize(product, output_multiplier, output_shift)
    write_out(op, out, saturate_int8(scaled + output_zero_point))


@register_kernel("cortex_m::quantized_div.out", num_returns=1)
def quantized_div_out(
    self, self_zero_point, other, other_zero_point, output_zero_point, output_scale, out
) -> None:
    op = "cortex_m::quantized_div.out"
    expect(op, "self", self, (torch.int8, torch.int16))
    expect(op, "other", other, (self.dtype,))
    if self.shape != other.shape:
        raise CortexMKernelError(
            op, f"operands must have equal shapes, got {list(self.shape)} and {list(other.shape)}"
        )
    numerator = (self.to(torch.int32) - self_zero_point).to(torch.float32)
    denominator = (other.to(torch.int32) - other_zero_point).to(torch.float32)
    # a zero divisor yields zero (the kernel's defined behaviour), not inf/nan
    quotient = torch.where(denominator != 0, numerator / denominator, torch.zeros_like(numerator))
    result = torch.round(quotient * output_scale) + output_zero_point
    info = torch.iinfo(self.dtype)
    write_out(op, out, torch.clamp(result, info.min, info.max).to(self.dtype))


@register_kernel("cortex_m::quantized_activation.out", num_returns=1)
def quantized_activation_out(input, lut, out) -> None:
    op = "cortex_m::quantized_activation.out"
    expect(op, "input", input, (torch.int8,))
    expect(op, "lut", lut, (torch.int8,))
    if lut.numel() != 256:
        raise CortexMKernelError(op, f"lut must have 256 entries, got {lut.numel()}")
    write_out(op, out, lut.reshape(256)[input.to(torch.int64) + 128])


def _min_max(op: str, fn, self, other, out) -> None:
    expect(op, "self", self)
    expect(op, "other", other, (self.dtype,))
    try:
        result = fn(self, other)
    except RuntimeError as exc:
        raise CortexMKernelError(
            op, f"cannot broadcast {list(self.shape)} with {list(other.shape)}"
        ) from exc
    write_out(op, out, result)


@register_kernel("cortex_m::minimum.out", num_returns=1)
def minimum_out(self, other, out) -> None:
    _min_max("cortex_m::minimum.out", torch.minimum, self, other, out)


@register_kernel("cortex_m::maximum.out", num_returns=1)
def maximum_out(self, other, out) -> None:
    _min_max("cortex_m::maximum.out", torch.maximum, self, other, out)


# ---------------------------------------------------------------- matrix products


@register_kernel("cortex_m::quantized_linear.out", num_returns=1)
def quantized_linear_out(
    input, weights, bias, kernel_sum, input_offset, filter_offset, output_offset,
    requantize_multipliers, requantize_shifts, activation_max, activation_min, out,
) -> None:  # fmt: skip
    op = "cortex_m::quantized_linear.out"
    expect(op, "input", input, (torch.int8,))
    expect(op, "weights", weights, (torch.int8,), ndim=2)
    if input.dim() == 0 or input.shape[-1] != weights.shape[1]:
        raise CortexMKernelError(
            op, f"input {list(input.shape)} does not match weights {list(weights.shape)}"
        )
    rows = input.reshape(-1, input.shape[-1]).to(torch.int32)
    if kernel_sum is not None:
        # MVE path: offsets folded AOT into kernel_sum (= sum(w) * input_offset + bias)
        expect(op, "kernel_sum", kernel_sum, (torch.int32,))
        acc = rows @ weights.to(torch.int32).T
        acc = acc + rows.sum(dim=-1, keepdim=True) * filter_offset + kernel_sum
    else:
        acc = (rows + input_offset) @ (weights.to(torch.int32) + filter_offset).T
        if bias is not None:
            acc = acc + expect(op, "bias", bias, (torch.int32,))
    # the kernel applies one (per-tensor) multiplier/shift pair: the first
    multipliers, shifts = list(requantize_multipliers), list(requantize_shifts)
    if not multipliers or not shifts:
        raise CortexMKernelError(op, "requantize_multipliers/requantize_shifts are empty")
    scaled = requantize(acc, int(multipliers[0]), int(shifts[0])) + output_offset
    result = saturate_int8(scaled, activation_min, activation_max)
    write_out(op, out, result.reshape(*input.shape[:-1], weights.shape[0]))


@register_kernel("cortex_m::quantized_batch_matmul.out", num_returns=1)
def quantized_batch_matmul_out(
    lhs, lhs_zero_point, rhs_transposed, rhs_zero_point,
    output_zero_point, output_multiplier, output_shift, scratch, out,
) -> None:  # fmt: skip
    op = "cortex_m::quantized_batch_matmul.out"
    expect(op, "lhs", lhs, (torch.int8,), ndim=3)
    expect(op, "rhs_transposed", rhs_transposed, (torch.int8,), ndim=3)
    if lhs.shape[0] != rhs_transposed.shape[0] or lhs.shape[2] != rhs_transposed.shape[2]:
        raise CortexMKernelError(
            op, f"lhs {list(lhs.shape)} does not match rhs_transposed {list(rhs_transposed.shape)}"
        )
    # the "zero points" are CMSIS offsets (negated zero points), hence the +
    a = lhs.to(torch.int64) + lhs_zero_point
    b = rhs_transposed.to(torch.int64) + rhs_zero_point
    acc = wrap_int32(torch.bmm(a, b.transpose(1, 2)))
    scaled = requantize(acc, output_multiplier, output_shift)
    write_out(op, out, saturate_int8(scaled + output_zero_point))


# ---------------------------------------------------------------- softmax and layout


@register_kernel("cortex_m::softmax.out", num_returns=1)
def softmax_out(
    input, dim, input_zero_point, output_zero_point, input_multiplier, input_shift, diff_min, out
) -> None:
    op = "cortex_m::softmax.out"
    expect(op, "input", input, (torch.int8,))
    if output_zero_point != _SOFTMAX_OUTPUT_ZERO_POINT:
        raise CortexMKernelError(
            op, f"output_zero_point must be {_SOFTMAX_OUTPUT_ZERO_POINT}, got {output_zero_point}"
        )
    if not -input.dim() <= dim < max(input.dim(), 1):
        raise CortexMKernelError(op, f"dim {dim} out of range for {input.dim()}-D input")
    # the (multiplier, shift) pair encodes input_scale * 2**(31 - integer bits)
    real = math.ldexp(float(input_multiplier) / float(1 << 31), input_shift)
    input_scale = real / float(1 << (31 - _SOFTMAX_INPUT_INTEGER_BITS))
    if input_scale <= 0:
        raise CortexMKernelError(
            op, f"input multiplier/shift give a non-positive scale {input_scale}"
        )
    logits = (input.to(torch.int32) - int(input_zero_point)).float() * input_scale
    probs = torch.softmax(logits, dim=dim)
    quantized = torch.round(probs / _SOFTMAX_OUTPUT_SCALE) + int(output_zero_point)
    write_out(op, out, saturate_int8(quantized))


@register_kernel("cortex_m::transpose.out", num_returns=1)
def transpose_out(input, perm, out) -> None:
    op = "cortex_m::transpose.out"
    expect(op, "input", input)
    if sorted(int(p) for p in perm) != list(range(input.dim())):
        raise CortexMKernelError(
            op, f"perm {list(perm)} is not a permutation of {input.dim()} dims"
        )
    write_out(op, out, input.permute(tuple(int(p) for p in perm)))


def _is_channels_last(tensor: torch.Tensor) -> bool:
    # the same test the lowering used when it wrote the pads in physical order
    if tensor.dim() != 4:
        return False
    if tensor.shape[1] == 1 or tensor.shape[2] == tensor.shape[3] == 1:
        return True
    return list(tensor.dim_order())[:2] == [0, 2]


@register_kernel("cortex_m::pad.out", num_returns=1)
def pad_out(input, pre_pad, post_pad, pad_value, out) -> None:
    op = "cortex_m::pad.out"
    expect(op, "input", input)
    rank = input.dim()
    if not 1 <= rank <= 4 or len(pre_pad) != 4 or len(post_pad) != 4:
        raise CortexMKernelError(
            op,
            f"expects a 1-D to 4-D input and 4 pads per side, got {rank}-D, {list(pre_pad)}, {list(post_pad)}",
        )
    pre, post = [int(p) for p in pre_pad], [int(p) for p in post_pad]
    if _is_channels_last(input):
        # pads are stored in NHWC (physical) order: bring them back to NCHW
        pre = [pre[i] for i in (0, 3, 1, 2)]
        post = [post[i] for i in (0, 3, 1, 2)]
    if min(pre + post) < 0:
        raise CortexMKernelError(op, f"negative padding {pre_pad} / {post_pad}")
    offset = 4 - rank
    padding: list[int] = []
    for i in reversed(range(rank)):
        padding += [pre[offset + i], post[offset + i]]
    write_out(op, out, F.pad(input, padding, mode="constant", value=pad_value))


# convolution and pooling kernels register themselves on import
from etmetal.runtime.kernels import cortex_m_spatial  # noqa: E402, F401
