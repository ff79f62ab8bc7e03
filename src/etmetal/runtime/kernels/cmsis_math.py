"""CMSIS-NN fixed-point arithmetic on torch tensors, shared by the ``cortex_m::`` kernels.

The Cortex-M kernels requantize int32 accumulators with a Q31 multiplier and a
power-of-two shift (``arm_nn_requantize``): a doubling high multiply rounded at
bit 30, then a rounding right shift whose ties go away from zero. Every helper
here takes per-tensor ints or per-channel tensors and works element-wise, so a
whole convolution output is requantized in one pass.
"""

from __future__ import annotations

import torch

from etmetal.runtime.kernels.cortex_m_common import CortexMKernelError

# CMSIS-NN's elementwise add lifts both int8 operands by 20 bits before rescaling them
ADD_LEFT_SHIFT = 20


def _as_int64(value: int | torch.Tensor) -> int | torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(torch.int64)
    return int(value)


def requantize(
    acc: torch.Tensor, multiplier: int | torch.Tensor, shift: int | torch.Tensor
) -> torch.Tensor:
    """``arm_nn_requantize``: ``acc * multiplier * 2**shift / 2**31`` rounded as CMSIS-NN does.

    ``multiplier``/``shift`` are ints or int tensors broadcastable against ``acc``
    (per-channel parameters). The arithmetic runs in int64 and the result is
    truncated to int32 like the C kernel's return value.
    """
    value = acc.to(torch.int64)
    multiplier = _as_int64(multiplier)
    shift = _as_int64(shift)
    if isinstance(shift, torch.Tensor):
        left = shift.clamp(min=0)
        right = (-shift).clamp(min=0)
    else:
        left, right = max(shift, 0), max(-shift, 0)

    value = value << left
    # arm_nn_doubling_high_mult_no_sat: round at bit 30, keep the high word
    result = (value * multiplier + (1 << 30)) >> 31

    # arm_nn_divide_by_power_of_two: round half away from zero
    if isinstance(right, torch.Tensor) or right:
        one = torch.ones((), dtype=torch.int64)
        mask = (one << right) - 1
        remainder = result & mask
        result = result >> right
        threshold = (mask >> 1) + (result < 0).to(torch.int64)
        result = result + (remainder > threshold).to(torch.int64)
    return result.to(torch.int32)


def wrap_int32(acc: torch.Tensor) -> torch.Tensor:
    """Reduce an exact integer accumulator to int32 with two's-complement wrap-around,
    as the C kernels' int32 accumulators behave."""
    return acc.to(torch.int64).to(torch.int32)


def fixed_point_scale(multiplier: int, shift: int) -> float:
    """The real scale a (Q31 multiplier, shift) pair encodes."""
    return multiplier * (2**shift) / (1 << 31)


def channel_view(params: torch.Tensor | list[int], channels: int, dim: int, ndim: int, op: str):
    """Per-channel parameters as an int64 tensor shaped to broadcast along ``dim``."""
    tensor = torch.as_tensor(params).reshape(-1).to(torch.int64)
    if tensor.numel() == 1:
        tensor = tensor.expand(channels)
    if tensor.numel() != channels:
        raise CortexMKernelError(
            op, f"{tensor.numel()} requantization parameters for {channels} output channels"
        )
    shape = [1] * ndim
    shape[dim] = channels
    return tensor.reshape(shape)
