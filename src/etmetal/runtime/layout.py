"""Scalar types and memory layout: ExecuTorch's ``ScalarType`` codes, dim orders, strides."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from etmetal.common.scalar_types import SCALAR_TYPE_CODES

# ExecuTorch ScalarType code (same numbering as c10) -> torch dtype
SCALAR_TYPES: dict[int, torch.dtype] = {
    code: getattr(torch, name)
    for name, code in SCALAR_TYPE_CODES.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}
DTYPE_CODES: dict[torch.dtype, int] = {v: k for k, v in SCALAR_TYPES.items()}

# c10::MemoryFormat codes as serialized in programs
MEMORY_FORMATS = {
    0: torch.contiguous_format,
    1: torch.preserve_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
}


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size() if dtype.is_complex else dtype.itemsize


def strides_for(sizes: Sequence[int], dim_order: Sequence[int]) -> list[int]:
    """Strides (in elements) of a dense tensor laid out in ``dim_order`` (outermost first)."""
    strides = [0] * len(sizes)
    step = 1
    for d in reversed(dim_order):
        strides[d] = step
        step *= max(int(sizes[d]), 1)
    return strides


def dim_order_of(t: torch.Tensor) -> list[int]:
    """The dim order a dense tensor is laid out in (ties keep the default order)."""
    strides = t.stride()
    return sorted(range(t.dim()), key=lambda d: -strides[d])


def is_default_dim_order(dim_order: Sequence[int]) -> bool:
    return all(d == i for i, d in enumerate(dim_order))


def numel(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def resize_in_dim_order(
    t: torch.Tensor,
    sizes: Sequence[int],
    capacity: int | None = None,
    dim_order: Sequence[int] | None = None,
) -> None:
    """Resize ``t`` in place to ``sizes`` keeping its storage, offset and dim order.

    ``capacity`` (elements) bounds the new size: planned tensors must stay inside
    the memory the program planned for them.
    """
    sizes = [int(s) for s in sizes]
    if list(t.shape) == sizes:
        return
    if len(sizes) != t.dim():
        raise ValueError(f"cannot resize a {t.dim()}-D tensor to {len(sizes)}-D shape {sizes}")
    if capacity is not None and numel(sizes) > capacity:
        raise ValueError(
            f"shape {sizes} ({numel(sizes)} elements) exceeds the planned capacity of "
            f"{capacity} elements"
        )
    # the program's dim order when known: strides cannot tell it apart on size-1 dims
    order = list(dim_order) if dim_order is not None else dim_order_of(t)
    t.as_strided_(sizes, strides_for(sizes, order), t.storage_offset())
