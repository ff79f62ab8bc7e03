"""``dim_order_ops::*``: copies and allocations that change a tensor's dim order.

The out tensor already carries the target dim order (the runtime built its strides from
the program's dim order), so a copy in logical order is the whole job; ``dim_order``
only has to agree with it.
"""

from __future__ import annotations

import torch

from etmetal.runtime.layout import dim_order_of, is_default_dim_order, resize_in_dim_order

from .registry import register_kernel


def _check_dim_order(op: str, dim_order, out: torch.Tensor) -> None:
    if dim_order is None:
        return
    dim_order = [int(d) for d in dim_order]
    if sorted(dim_order) != list(range(out.dim())):
        raise ValueError(f"{op}: dim_order {dim_order} is not a permutation of {out.dim()} dims")
    if (
        out.numel() > 1
        and dim_order != dim_order_of(out)
        and not (is_default_dim_order(dim_order) and out.is_contiguous())
    ):
        raise ValueError(
            f"{op}: dim_order {dim_order} disagrees with the out tensor's dim order "
            f"{dim_order_of(out)}"
        )


def _copy(op: str, self: torch.Tensor, non_blocking: bool, dim_order, out: torch.Tensor) -> None:
    if out.shape != self.shape:
        resize_in_dim_order(out, self.shape)
    _check_dim_order(op, dim_order, out)
    out.copy_(self)


@register_kernel("dim_order_ops::_to_dim_order_copy.out", num_returns=1)
def to_dim_order_copy(self, non_blocking=False, dim_order=None, out=None):
    _copy("_to_dim_order_copy", self, non_blocking, dim_order, out)


@register_kernel("dim_order_ops::_clone_dim_order.out", num_returns=1)
def clone_dim_order(self, non_blocking=False, dim_order=None, out=None):
    if self.dtype != out.dtype:
        raise ValueError(f"_clone_dim_order: dtype {self.dtype} != out dtype {out.dtype}")
    _copy("_clone_dim_order", self, non_blocking, dim_order, out)


@register_kernel("dim_order_ops::_empty_dim_order.out", num_returns=1)
def empty_dim_order(size, dim_order=None, out=None):
    resize_in_dim_order(out, [int(s) for s in size])
    _check_dim_order("_empty_dim_order", dim_order, out)
