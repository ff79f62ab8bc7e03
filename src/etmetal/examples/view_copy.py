"""Layout test models for ``view_copy`` lowering: reshapes whose input is channels-last,
sliced, permuted, dynamically shaped, 5-D, or plain contiguous.

Each :class:`ViewCopyCase` says how to build the module, what to export it with, and what
to run it on (``run_inputs`` may differ from ``example_inputs``, e.g. another batch size
for a dynamic dimension). Everything is deterministic given the case, so the regression
command, the tests and the runtime's own tests can share them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.export import Dim

CL = torch.channels_last
CL3D = torch.channels_last_3d


@dataclass(frozen=True)
class ViewCopyCase:
    """One model and its inputs.

    Attributes:
        name: short identifier (table rows, test ids).
        make_module: builds the module in eval mode, weights seeded from the name.
        make_example_inputs: inputs for ``torch.export.export``.
        dynamic_shapes: ``dynamic_shapes`` for ``torch.export.export`` (None: static).
        make_run_inputs: inputs to compare eager and the lowered program on; defaults to
            fresh example inputs.
        stock_safe: True when every view in the model reads row-major memory, so the
            stock lowering is expected to be right too (the control cases).
        bitwise: True when the lowered program does the same arithmetic as eager (data
            movement and scalar ops only), so outputs must match bit for bit.
        description: one line for tables and docs.
    """

    name: str
    make_module: Callable[[], nn.Module]
    make_example_inputs: Callable[[], tuple[torch.Tensor, ...]]
    dynamic_shapes: Any = None
    make_run_inputs: Callable[[], tuple[torch.Tensor, ...]] | None = field(default=None)
    stock_safe: bool = False
    bitwise: bool = False
    description: str = ""

    def module(self) -> nn.Module:
        torch.manual_seed(_seed(self.name))
        return self.make_module().eval()

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(_seed(self.name) + 1)
        return self.make_example_inputs()

    def run_inputs(self) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(_seed(self.name) + 2)
        return (self.make_run_inputs or self.make_example_inputs)()

    def export(self) -> torch.export.ExportedProgram:
        return torch.export.export(
            self.module(), self.example_inputs(), dynamic_shapes=self.dynamic_shapes
        )


def _seed(name: str) -> int:
    return sum(name.encode()) * 7919 % (2**31)


class PatchEmbed(nn.Module):
    """ViT patch embedding: 4x4 patches -> tokens (N, HW/16, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, 8, kernel_size=4, stride=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class KeywordSpottingCNN(nn.Module):
    """A small keyword-spotting CNN over MFCC frames with deltas (N, 3, 49, 10): the first
    conv spans all 10 coefficients, so its channels-last output (N, 16, 47, 1) flattens to
    (N, 16, 47) as a view; a per-frame linear head and a mean over time give the logits."""

    def __init__(self, classes: int = 12) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=(3, 10))
        self.conv2 = nn.Conv2d(16, 16, kernel_size=(3, 1), padding=(1, 0))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        frames = x.flatten(2).transpose(1, 2)  # (N, T, C)
        return self.head(frames).mean(dim=1)


class ConvHeadClassifier(nn.Module):
    """DS-CNN style tail: channels-last features, a depthwise conv over the whole map
    (a learned global pool) to (N, C, 1, 1), then flatten -> linear."""

    def __init__(self, classes: int = 12) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 16, kernel_size=3, padding=1)
        self.pool = nn.Conv2d(16, 16, kernel_size=(6, 5), groups=16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.pool(torch.relu(self.conv(x))))
        return self.fc(x.flatten(1))


class SlicedView(nn.Module):
    """A channel slice, scaled and reshaped: the slice is a fresh row-major tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, 2:6] * 2.0).reshape(x.shape[0], 4, -1) + 1.0


class PermutedView(nn.Module):
    """A transposed (H <-> W) tensor, reshaped."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.transpose(2, 3) * 2.0).reshape(x.shape[0], x.shape[1], -1) - 1.0


class VideoTokens(nn.Module):
    """Video tokens from a channels_last_3d clip (N, C, T, H, W): a unary op keeps the
    5-D layout (the stock kernels take it there), then (T, H, W) flatten into tokens for
    a linear projection."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(x).flatten(2).transpose(1, 2))


class ContiguousViews(nn.Module):
    """Row-major everywhere: every view is a free reinterpretation (the control case)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(24, 32)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x.reshape(x.shape[0], 24))  # view of an input
        h = torch.relu(h).view(x.shape[0], 4, 8)  # view of an intermediate
        return self.fc2(h).view(x.shape[0], 32) * 0.5


def _randn(*shape: int, memory_format: torch.memory_format = torch.contiguous_format):
    return torch.randn(*shape).to(memory_format=memory_format)


DEFAULT = torch.contiguous_format
BATCH = Dim("batch", min=1, max=8)


def _case(
    name: str,
    make_module: Callable[[], nn.Module],
    shape: tuple[int, ...],
    layout: torch.memory_format,
    description: str,
    *,
    run_shape: tuple[int, ...] | None = None,
    **flags: bool,
) -> ViewCopyCase:
    """A case whose one input is random of ``shape`` in ``layout``; a ``run_shape`` makes
    dim 0 a dynamic batch, exported at ``shape`` and run at ``run_shape``."""
    return ViewCopyCase(
        name=name,
        make_module=make_module,
        make_example_inputs=lambda: (_randn(*shape, memory_format=layout),),
        dynamic_shapes=None if run_shape is None else ({0: BATCH},),
        make_run_inputs=None
        if run_shape is None
        else (lambda: (_randn(*run_shape, memory_format=layout),)),
        description=description,
        **flags,
    )


# fmt: off
CASES: list[ViewCopyCase] = [
    _case("patch_embed", PatchEmbed, (1, 3, 32, 32), CL,
          "ViT patch embedding: Conv2d(3, 8, 4, stride=4) on channels-last, "
          "flatten(2).transpose(1, 2)"),
    _case("kws_frames", KeywordSpottingCNN, (1, 3, 49, 10), CL,
          "keyword-spotting CNN: channels-last conv features flattened per frame "
          "-> linear head"),
    _case("kws_conv_head", ConvHeadClassifier, (1, 4, 6, 5), CL,
          "channels-last conv, depthwise conv to 1x1, flatten(1) -> linear"),
    _case("sliced", SlicedView, (2, 8, 6, 6), DEFAULT,
          "reshape of a channel slice", bitwise=True, stock_safe=True),
    _case("permuted", PermutedView, (2, 8, 6, 5), DEFAULT,
          "reshape of a transposed (H <-> W) tensor", bitwise=True, stock_safe=True),
    _case("dynamic_batch", PatchEmbed, (2, 3, 16, 16), CL,
          "patch embedding with a dynamic batch (exported at 2, run at 5)",
          run_shape=(5, 3, 16, 16)),
    _case("channels_last_3d", VideoTokens, (1, 4, 3, 6, 6), CL3D,
          "5-D channels_last_3d clip: relu, flatten(2).transpose(1, 2) -> linear"),
    _case("contiguous", ContiguousViews, (3, 2, 3, 4), DEFAULT,
          "row-major input and intermediates: every view is safe (control)", stock_safe=True),
    _case("contiguous_dynamic", ContiguousViews, (3, 2, 3, 4), DEFAULT,
          "the control case with a dynamic batch: views resized at run time (et_view)",
          run_shape=(6, 2, 3, 4), stock_safe=True),
]
# fmt: on

CASES_BY_NAME: dict[str, ViewCopyCase] = {case.name: case for case in CASES}


def get_case(name: str) -> ViewCopyCase:
    try:
        return CASES_BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"unknown view_copy case {name!r}; choose from {', '.join(CASES_BY_NAME)}"
        ) from None
