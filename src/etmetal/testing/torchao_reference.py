"""torchao's int4 weight-only linear, computed the way torchao defines it, from the float
weights: its min-max quantizer (``UIntxWeightOnlyConfig``'s), each weight dequantized as
``q * scale + zero`` of its group, then one matmul. Independent of etmetal's packing and
kernels, so a delegate's int4 result can be judged against it."""

from __future__ import annotations

import torch


def int4_linear_reference(
    linear: torch.nn.Linear, x: torch.Tensor, group_size: int
) -> torch.Tensor:
    """What torchao's fpa4w-quantized ``linear`` computes for ``x`` (float32)."""
    from torchao.experimental.quant_api import _quantize

    weight = linear.weight.detach()
    q, scales, zero_points = _quantize(weight, group_size, 4, True, signed=False)
    zeros = -zero_points * scales  # torchao stores the zero as an additive term
    w = q.float() * scales.repeat_interleave(group_size, 1)
    w = w + zeros.repeat_interleave(group_size, 1)
    y = x @ w.t()
    return y if linear.bias is None else y + linear.bias.detach()
