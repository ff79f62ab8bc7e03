"""``quantized_decomposed::*`` out variants, computed by torch's reference decompositions.

torch registers only the functional overloads (``torch.ao.quantization.fx._decomposed``);
ExecuTorch programs call the ``.out`` ones, whose arguments are the functional ones
followed by the out tensor (``out_dtype`` is keyword-only where it exists).
"""

from __future__ import annotations

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  registers torch.ops.quantized_decomposed

from etmetal.runtime.layout import SCALAR_TYPES

from .registry import register_kernel

_q = torch.ops.quantized_decomposed


def _dtype(code):
    if code is None or isinstance(code, torch.dtype):
        return code
    return SCALAR_TYPES[int(code)]


def _into(out: torch.Tensor, value: torch.Tensor) -> None:
    if out.shape != value.shape:
        out.resize_(value.shape)
    out.copy_(value)


def _quantize(functional):
    def kernel(input, scale, zero_point, quant_min, quant_max, dtype, out):
        _into(out, functional(input, scale, zero_point, quant_min, quant_max, _dtype(dtype)))

    return kernel


def _dequantize(functional):
    def kernel(input, scale, zero_point, quant_min, quant_max, dtype, out_dtype=None, out=None):
        if out is None:  # programs written before out_dtype existed
            out, out_dtype = out_dtype, None
        value = functional(
            input,
            scale,
            zero_point,
            quant_min,
            quant_max,
            _dtype(dtype),
            out_dtype=_dtype(out_dtype),
        )
        _into(out, value)

    return kernel


for _suffix, _overload in (
    ("out", "default"),
    ("tensor_out", "tensor"),
    ("tensor2_out", "tensor2"),
):
    register_kernel(f"quantized_decomposed::quantize_per_tensor.{_suffix}", num_returns=1)(
        _quantize(getattr(_q.quantize_per_tensor, _overload))
    )
    register_kernel(f"quantized_decomposed::dequantize_per_tensor.{_suffix}", num_returns=1)(
        _dequantize(getattr(_q.dequantize_per_tensor, _overload))
    )


@register_kernel("quantized_decomposed::quantize_per_channel.out", num_returns=1)
def quantize_per_channel(input, scales, zero_points, axis, quant_min, quant_max, dtype, out):
    _into(
        out,
        _q.quantize_per_channel(
            input, scales, zero_points, axis, quant_min, quant_max, _dtype(dtype)
        ),
    )


@register_kernel("quantized_decomposed::dequantize_per_channel.out", num_returns=1)
def dequantize_per_channel(
    input, scales, zero_points, axis, quant_min, quant_max, dtype, out_dtype=None, out=None
):
    if out is None:
        out, out_dtype = out_dtype, None
    if zero_points is None:
        zero_points = torch.zeros(scales.shape, dtype=torch.int64)
    value = _q.dequantize_per_channel(
        input,
        scales,
        zero_points,
        axis,
        quant_min,
        quant_max,
        _dtype(dtype),
        out_dtype=_dtype(out_dtype),
    )
    _into(out, value)


@register_kernel("quantized_decomposed::choose_qparams.Tensor_out", num_returns=2)
def choose_qparams(input, quant_min, quant_max, eps, dtype, scale_out, zero_point_out):
    scale, zero_point = _q.choose_qparams.tensor(input, quant_min, quant_max, eps, _dtype(dtype))
    _into(scale_out, scale)
    _into(zero_point_out, zero_point)
