"""Models whose AOTI code reads and writes non-packed views of one buffer.

Each case compiles (host AOTI) to a wrapper that calls
``aoti_torch__reinterpret_tensor`` with strides that leave holes (``chunk``,
``split``, ``narrow`` along an inner dim) and then lets a kernel write through
those views before the base buffer is read again. An implementation that copies
such views (upstream's Metal shims) loses the writes; see pytorch/executorch#22983.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class StridedViewCase:
    name: str
    make_module: Callable[[], nn.Module]
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]


class ChunkCat(nn.Module):
    """``y = linear(x); a, b = y.chunk(2, -1); cat([-b, a], -1)`` (the YOLO C2f pattern)."""

    def __init__(self, features: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 2 * features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.linear(x).chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)


class RopeSplitHalves(nn.Module):
    """Rotary embedding on q/k projections with the rotate-half trick (split halves)."""

    def __init__(self, dim: int = 32, heads: int = 2, seq: int = 8) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qk = nn.Linear(dim, 2 * dim)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        emb = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.split(x.shape[-1] // 2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q, k = self.qk(x).chunk(2, dim=-1)
        q = q.view(bsz, seq, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seq, self.heads, self.head_dim).transpose(1, 2)
        q = q * self.cos + self._rotate_half(q) * self.sin
        k = k * self.cos + self._rotate_half(k) * self.sin
        return q @ k.transpose(-1, -2)


class ChannelsLastChunkCat(nn.Module):
    """Conv on a channels-last input, chunk along C, one half convolved again, cat."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.cv1 = nn.Conv2d(channels, 2 * channels, 1)
        self.m = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, dim=1)
        return torch.cat([a, self.m(b), b.relu()], dim=1)


class NarrowLastDim(nn.Module):
    """``narrow`` on the last dim of a matmul result, then written into a cat."""

    def __init__(self, features: int = 24) -> None:
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        head = y.narrow(-1, 0, 8)
        tail = y.narrow(-1, 8, 16)
        return torch.cat([tail.sigmoid(), head * 2.0, tail.sum(-1, keepdim=True)], dim=-1)


CASES: list[StridedViewCase] = [
    StridedViewCase("chunk_cat", lambda: ChunkCat(), lambda: (torch.randn(4, 16),)),
    StridedViewCase(
        "rope_split_halves", lambda: RopeSplitHalves(), lambda: (torch.randn(2, 8, 32),)
    ),
    StridedViewCase(
        "channels_last_chunk_cat",
        lambda: ChannelsLastChunkCat(),
        lambda: (torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last),),
    ),
    StridedViewCase("narrow_last_dim", lambda: NarrowLastDim(), lambda: (torch.randn(3, 24),)),
]

CASES_BY_NAME = {case.name: case for case in CASES}


def exported(case: StridedViewCase) -> torch.export.ExportedProgram:
    """The case exported with its example inputs (module in eval mode, seeded weights)."""
    torch.manual_seed(0)
    module = case.make_module().eval()
    return torch.export.export(module, case.make_inputs())
