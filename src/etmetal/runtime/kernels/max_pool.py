"""``aten::max_pool2d_with_indices.out`` for any input dim order.

ATen's CPU max pool takes a channels-last path for channels-last inputs, and for integer
dtypes that path indexes the whole image with the element type's own integer
(``input_depth*input_height*input_width <= max`` fails for int8 once the image holds more
than 127 elements). Quantized programs that keep a max pool outside the Cortex-M kernels
hand it exactly that: an int8 tensor in NHWC dim order. The kernel pools a contiguous
copy instead and writes the result through the out tensors' own strides, so they keep
the dim order the program planned. Indices are offsets within one ``H*W`` plane, the same
for either layout, so they need no translation.
"""

from __future__ import annotations

import torch

from etmetal.runtime.layout import resize_in_dim_order

from .registry import register_kernel

_OP = torch.ops.aten.max_pool2d_with_indices.default


@register_kernel("aten::max_pool2d_with_indices.out")
def max_pool2d_with_indices_out(
    input: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    out: torch.Tensor,
    indices: torch.Tensor,
) -> None:
    """Max pool over an NCHW-contiguous copy of ``input``, stored into ``out``/``indices``."""
    if input.dim() not in (3, 4):
        raise ValueError(
            f"aten::max_pool2d_with_indices.out: input must be 3-D or 4-D, got shape "
            f"{list(input.shape)}"
        )
    values, where = _OP(input.contiguous(), kernel_size, stride, padding, dilation, bool(ceil_mode))
    for name, slot, result in (("out", out, values), ("indices", indices, where)):
        try:
            # dynamic shapes: within the planned capacity, keeping the planned dim order
            resize_in_dim_order(
                slot,
                result.shape,
                capacity=slot.untyped_storage().nbytes() // slot.element_size()
                - slot.storage_offset(),
            )
        except ValueError as e:
            raise ValueError(f"aten::max_pool2d_with_indices.out: {name}: {e}") from None
        slot.copy_(result)
