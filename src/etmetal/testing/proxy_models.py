"""Models whose ``.so`` calls the proxy executor (operators without a C shim): an ATen
operator AOTI has no shim for and custom operators with int, float and int-list arguments.

Shared by the native proxy executor's tests, the differential test and the trust tests of
both runtimes (the operators are registered once per process, when this module is imported).
"""

from __future__ import annotations

import torch


@torch.library.custom_op("etmtest_native::shift_scale", mutates_args=())
def shift_scale(x: torch.Tensor, w: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    return x * alpha + w.view(1, -1, 1, 1) + k


@shift_scale.register_fake
def _(x, w, k, alpha):
    return torch.empty_like(x)


@torch.library.custom_op("etmtest_native::halves", mutates_args=())
def halves(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x[..., ::2] * scale, x[..., 1::2] - scale


@halves.register_fake
def _(x, scale):
    shape = (*x.shape[:-1], x.shape[-1] // 2)
    return x.new_empty(shape), x.new_empty(shape)


@torch.library.custom_op("etmtest_native::repeat_add", mutates_args=())
def repeat_add(x: torch.Tensor, reps: list[int], bias: float) -> torch.Tensor:
    return x.repeat(reps) + bias


@repeat_add.register_fake
def _(x, reps, bias):
    return x.new_empty([s * r for s, r in zip(x.shape, reps)])


@torch.library.custom_op("etmtest_native::scaled", mutates_args=())
def scaled(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + 1


@scaled.register_fake
def _(x, alpha):
    return torch.empty_like(x)


class LinearThenCustom(torch.nn.Module):
    """A linear layer (a C shim) then a custom op with a float: one extern node whose
    table entry carries the float the trust tests rewrite."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.etmtest_native.scaled(self.lin(x), 0.5)


class Upsampler(torch.nn.Module):
    """An ATen operator without a C shim, then a custom op with an int and a float."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        y = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear", antialias=True)
        return torch.ops.etmtest_native.shift_scale(y.relu(), self.w, 3, 0.5) * 2 + 1


class TwoResults(torch.nn.Module):
    """A custom op returning two tensors, one returning an int list's repeat."""

    def forward(self, x):
        a, b = torch.ops.etmtest_native.halves(x.sin(), 1.5)
        return torch.ops.etmtest_native.repeat_add(a * b, [1, 2], 0.25), b.cos()


# name -> (module class, its example inputs)
MODELS = {
    "upsampler": (Upsampler, lambda: (torch.randn(1, 3, 5, 6),)),
    "two_results": (TwoResults, lambda: (torch.randn(4, 8),)),
}
