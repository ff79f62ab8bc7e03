"""Argument checking and result storing shared by the ``cortex_m::`` kernels."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from etmetal.runtime.layout import SCALAR_TYPES  # ScalarType codes as the program stores them


class CortexMKernelError(ValueError):
    """A ``cortex_m::`` kernel was called with arguments it cannot honour."""

    def __init__(self, op: str, message: str):
        super().__init__(f"{op}: {message}")
        self.op = op


def scalar_type(op: str, value: int | torch.dtype) -> torch.dtype:
    """Map a ``ScalarType`` argument (an ExecuTorch code or a torch dtype) to a torch dtype."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value in SCALAR_TYPES:
        return SCALAR_TYPES[value]
    raise CortexMKernelError(op, f"unsupported ScalarType {value!r}")


def expect(
    op: str,
    name: str,
    tensor: object,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | None = None,
) -> torch.Tensor:
    """Check one tensor argument and name it in the error if it is not what ``op`` takes."""
    if not isinstance(tensor, torch.Tensor):
        raise CortexMKernelError(
            op, f"argument {name!r} must be a tensor, got {type(tensor).__name__}"
        )
    if dtypes is not None and tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise CortexMKernelError(
            op,
            f"argument {name!r} has dtype {str(tensor.dtype).removeprefix('torch.')}, expected {allowed}",
        )
    if ndim is not None and tensor.dim() != ndim:
        raise CortexMKernelError(
            op, f"argument {name!r} must be {ndim}-D, got shape {list(tensor.shape)}"
        )
    return tensor


def write_out(op: str, out: object, result: torch.Tensor) -> None:
    """Store ``result`` in the planned ``out`` tensor in logical element order.

    ``out`` keeps its dim order; it is resized (within the runtime's planned
    capacity) only when the result's shape differs, as for dynamic shapes.
    """
    out = expect(op, "out", out)
    if out.dtype != result.dtype:
        raise CortexMKernelError(
            op,
            f"out has dtype {str(out.dtype).removeprefix('torch.')}, the result is "
            f"{str(result.dtype).removeprefix('torch.')}",
        )
    if tuple(out.shape) != tuple(result.shape):
        channels_last = out.dim() == 4 and out.is_contiguous(memory_format=torch.channels_last)
        fmt = (
            torch.channels_last if channels_last and result.dim() == 4 else torch.contiguous_format
        )
        out.resize_(result.shape, memory_format=fmt)
    out.copy_(result)


def saturate_int8(values: torch.Tensor, low: int = -128, high: int = 127) -> torch.Tensor:
    return torch.clamp(values, low, high).to(torch.int8)
