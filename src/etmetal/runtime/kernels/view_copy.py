"""``aten::view_copy.out`` for any input dim order.

The stock portable kernel memcpys, so it is only right for default-dim-order inputs and
rejects the rest. ``view_copy`` is defined on logical element order: the result holds the
input's elements in row-major order of its logical shape, whatever the input's and the
out tensor's physical layouts are. A dense default-order input and out take one flat copy.
When only one side is in default order (channels-last input, say) the copy is a
transpose; the native tiled strided copy (``strided_copy``) does it at 0.6-0.9 of a
contiguous copy's bandwidth (``etmetal bench overhead``), with torch as the fallback for what it does not
take (both sides permuted, odd dtypes). A contiguous out is gathered into directly, with
no view of it made: at 1 MiB the Python path is a tenth of the call.
"""

from __future__ import annotations

import torch

from etmetal.runtime.layout import numel, resize_in_dim_order

from .registry import register_kernel
from .strided_copy import gather_contiguous, strided_copy


def target_size(self_shape: list[int], size: list[int]) -> list[int]:
    """``size`` with a ``-1`` inferred; errors name the shapes involved."""
    sizes = [int(s) for s in size]
    total = numel(self_shape)
    infer = [i for i, s in enumerate(sizes) if s == -1]
    if len(infer) > 1:
        raise ValueError(f"view_copy: only one dimension can be -1, got size {sizes}")
    bad = [s for s in sizes if s < -1]
    if bad:
        raise ValueError(f"view_copy: invalid size {sizes}: negative dimension {bad[0]}")
    if infer:
        known = numel([s for s in sizes if s != -1])
        if known == 0 or total % known:
            raise ValueError(
                f"view_copy: cannot view an input of shape {self_shape} ({total} elements) "
                f"as {sizes}"
            )
        sizes[infer[0]] = total // known
    if numel(sizes) != total:
        raise ValueError(
            f"view_copy: size {sizes} has {numel(sizes)} elements but the input of shape "
            f"{self_shape} has {total}"
        )
    return sizes


@register_kernel("aten::view_copy.out", num_returns=1)
def view_copy(self: torch.Tensor, size: list[int], out: torch.Tensor) -> None:
    out_shape = list(out.shape)
    # planned out already has the target shape (the usual case): nothing to infer or resize
    if out_shape == size and out.numel() == self.numel():
        sizes = out_shape
    else:
        sizes = target_size(list(self.shape), size)
        if out_shape != sizes:
            if out.dim() != len(sizes):
                raise ValueError(
                    f"view_copy: out tensor is {out.dim()}-D but size {sizes} is {len(sizes)}-D"
                )
            resize_in_dim_order(out, sizes)
    if self.dtype != out.dtype:
        raise ValueError(f"view_copy: input dtype {self.dtype} != out dtype {out.dtype}")
    if out.numel() == 0:
        return
    if out.is_contiguous():
        if self.is_contiguous():
            # logical order == memory order on both sides: one flat copy
            out.view(-1).copy_(self.view(-1))
            return
        if gather_contiguous(out, self):
            return  # gathered in logical order straight into out
    elif self.is_contiguous() and strided_copy(out, self.view(sizes)):
        return  # scattered by out's strides
    # gather in logical order (reshape copies strided inputs), scatter by out's strides
    out.copy_(self.reshape(sizes))
