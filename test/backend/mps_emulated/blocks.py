"""Small Llama- and ViT-like blocks (HF-style layers) for the emulated-target tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from etmetal.examples.demo import rope_tables, rotate_half


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class LlamaBlock(nn.Module):
    """Pre-norm decoder layer: RMSNorm, GQA attention with RoPE and a causal mask, SwiGLU."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * 96, bias=False)
        self.down = nn.Linear(96, dim, bias=False)
        cos, sin = rope_tables(self.head_dim, seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).chunk(2, dim=-1)
        k = k.reshape(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class VitBlock(nn.Module):
    """Patch embedding (conv), class token, pre-norm attention and a GELU MLP, then a head."""

    def __init__(self, dim: int = 48, heads: int = 4, patch: int = 4, image: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, n + 1, dim))
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, 10)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.embed(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        b, s, d = x.shape
        # timm's layout: one qkv projection split into (3, batch, heads, seq, head_dim)
        qkv = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        att = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        x = x + self.mlp(self.norm2(x))
        return self.head(x[:, 0])


def llama_block() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return LlamaBlock(), (torch.randn(2, 16, 64),)


def vit_block() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return VitBlock(), (torch.randn(2, 3, 16, 16),)
