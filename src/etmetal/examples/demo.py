"""The models ``etmetal demo`` lowers to the Metal delegate and runs end to end.

- ``transformer_block``: pre-norm attention with rotary embeddings applied by the
  split-halves ``rotate_half`` trick (non-packed views the ``.so`` writes through), causal
  scaled dot-product attention, and a GELU MLP, with residuals.
- ``patch_embedding``: a ViT stem on a channels-last image: strided conv patches,
  flattened to tokens, layer-normed, plus a learned position embedding (the layout
  ``view_copy`` gets wrong in the stock lowering).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


def rope_tables(head_dim: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) tables, (seq, head_dim), in the rotate-half layout."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.split(x.shape[-1] // 2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class TransformerBlock(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, seq: int = 16, hidden: int = 128) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        cos, sin = rope_tables(self.head_dim, seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(bsz, seq, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(bsz, seq, dim))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class PatchEmbedding(nn.Module):
    def __init__(self, channels: int = 3, dim: int = 48, patch: int = 4, image: int = 32) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)
        self.norm = nn.LayerNorm(dim)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.conv(x).flatten(2).transpose(1, 2)  # [B, patches, dim]
        return self.norm(tokens) + self.pos


@dataclass(frozen=True)
class DemoModel:
    name: str
    description: str
    make_module: Callable[[], nn.Module]
    make_inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    atol: float = 1e-4
    rtol: float = 1e-4


DEMO_MODELS: list[DemoModel] = [
    DemoModel(
        "transformer_block",
        "attention (RoPE via split halves, causal SDPA) + GELU MLP, d_model 64, 4 heads, seq 16",
        TransformerBlock,
        lambda g: (torch.randn(2, 16, 64, generator=g),),
    ),
    DemoModel(
        "patch_embedding",
        "ViT patch embedding on a channels-last 2x3x32x32 image (4x4 patches -> 64 tokens x 48)",
        PatchEmbedding,
        lambda g: (torch.randn(2, 3, 32, 32, generator=g).to(memory_format=torch.channels_last),),
    ),
]

DEMO_MODELS_BY_NAME = {m.name: m for m in DEMO_MODELS}


def get_demo(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A seeded module in eval mode and seeded example inputs."""
    if name not in DEMO_MODELS_BY_NAME:
        raise KeyError(f"unknown demo model {name!r}; choose from {', '.join(DEMO_MODELS_BY_NAME)}")
    model = DEMO_MODELS_BY_NAME[name]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = model.make_module().eval()
    return module, model.make_inputs(torch.Generator().manual_seed(seed))
