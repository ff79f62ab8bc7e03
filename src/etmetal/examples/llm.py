"""LLM-shaped programs: a decoder-only LM with a static KV cache, and a speech-style
encoder + decoder.

The KV cache is a set of registered buffers updated in place with ``index_copy_`` at the
positions the caller passes (``input_pos``), as ExecuTorch's Voxtral export does, so the
exported methods mutate buffers and the Metal partitioner moves them into the delegate.

- :class:`DecoderLM` exports as two methods, ``prefill`` (dynamic sequence length) and
  ``decode`` (one token). Both read the same weights; each method's program declares its
  own KV cache, so running ``decode`` after ``prefill`` sees the prompt only when the
  program shares mutable buffers across methods (``share_mutable_buffers``).
- :class:`SpeechEncoderDecoder` exports as ``encoder`` (features -> embeddings),
  ``token_embedding``, and the text decoder as ``prefill`` (embeddings of any length) and
  ``decode`` (one embedding), after the method split of upstream's Voxtral recipe.

Sizes come from :class:`LMConfig`: :data:`TINY` for tests, :data:`BENCH_30M` (about 30M
parameters) for ``etmetal bench llm``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from etmetal.common.targets import HOST


@dataclass(frozen=True)
class LMConfig:
    vocab: int = 64
    dim: int = 32
    layers: int = 2
    heads: int = 4
    hidden: int = 64
    max_seq: int = 64
    # speech encoder (encoder + decoder program only)
    mels: int = 16
    encoder_layers: int = 1


# one layer: every behaviour the tests check (per-layer KV caches, weights shared across
# methods, 32 decode steps against eager) shows with one block, at a third less lowering
TINY = LMConfig(layers=1)
BENCH_30M = LMConfig(vocab=8192, dim=512, layers=6, heads=8, hidden=1536, max_seq=256)
CONFIGS = {"tiny": TINY, "30m": BENCH_30M}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rope_tables(cfg: LMConfig) -> tuple[torch.Tensor, torch.Tensor]:
    half = cfg.dim // cfg.heads // 2
    inv = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    angles = torch.arange(cfg.max_seq, dtype=torch.float32)[:, None] * inv[None, :]
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, seq, head_dim); cos/sin: (seq, head_dim / 2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class CachedAttention(nn.Module):
    """Self-attention over a static KV cache written at ``input_pos`` with ``index_copy_``."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.dim // cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.out = nn.Linear(cfg.dim, cfg.dim, bias=False)
        shape = (1, cfg.heads, cfg.max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        input_pos: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = _rotate(q.view(b, s, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = _rotate(k.view(b, s, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        v = v.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        scores = q @ self.k_cache.transpose(-2, -1) * (1.0 / math.sqrt(self.head_dim))
        scores = scores.masked_fill(mask, float("-inf"))
        y = scores.softmax(dim=-1) @ self.v_cache
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim)
        self.attn = CachedAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim)
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x, input_pos, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), input_pos, cos, sin, mask)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TextDecoder(nn.Module):
    """Transformer layers over input embeddings at positions ``input_pos``; returns the
    logits of the last position."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        cos, sin = _rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("positions", torch.arange(cfg.max_seq), persistent=False)

    def forward(self, embeds: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]
        # a query at position p sees the cache slots 0..p
        mask = self.positions[None, :] > input_pos[:, None]
        x = embeds
        for block in self.blocks:
            x = block(x, input_pos, cos, sin, mask)
        return self.lm_head(self.norm(x[:, -1, :]))

    def reset_cache(self) -> None:
        with torch.no_grad():
            for block in self.blocks:
                block.attn.k_cache.zero_()
                block.attn.v_cache.zero_()


class DecoderLM(nn.Module):
    """A decoder-only LM: ``forward(tokens (1, S), input_pos (S,)) -> logits (1, vocab)``."""

    def __init__(self, cfg: LMConfig = TINY) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.decoder = TextDecoder(cfg)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.embed(tokens), input_pos)

    def reset_cache(self) -> None:
        self.decoder.reset_cache()


class SpeechEncoder(nn.Module):
    """Features (1, mels, frames) -> embeddings (1, frames / 2, dim) for the text decoder."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cfg.mels, cfg.dim, 3, stride=2, padding=1)
        layer = nn.TransformerEncoderLayer(
            cfg.dim, cfg.heads, cfg.hidden, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.ModuleList(
            layer if i == 0 else _clone(layer) for i in range(cfg.encoder_layers)
        )
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv(features)).transpose(1, 2)
        for layer in self.layers:
            x = layer(x)
        return self.proj(x)


def _clone(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)


class SpeechEncoderDecoder(nn.Module):
    """Encoder + text decoder; the program's methods are its three parts."""

    def __init__(self, cfg: LMConfig = TINY) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = SpeechEncoder(cfg)
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.decoder = TextDecoder(cfg)


class _Part(nn.Module):
    """One exported method of a multi-method model; it holds the whole model, so every
    method names a shared parameter or buffer by the same FQN."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


class _Encoder(_Part):
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(features)


class _TokenEmbedding(_Part):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed(tokens)


class _TextDecoder(_Part):
    def forward(self, embeds: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.model.decoder(embeds, input_pos)


class _LM(_Part):
    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self.model(tokens, input_pos)


def make_decoder_lm(cfg: LMConfig = TINY, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(cfg).eval()


def make_speech_model(cfg: LMConfig = TINY, seed: int = 0) -> SpeechEncoderDecoder:
    torch.manual_seed(seed)
    return SpeechEncoderDecoder(cfg).eval()


def lm_exports(model: DecoderLM, prompt_len: int = 8) -> dict[str, Any]:
    """``{"prefill": ExportedProgram, "decode": ExportedProgram}`` of ``model``."""
    cfg = model.cfg
    seq = torch.export.Dim("seq", min=2, max=cfg.max_seq)
    prompt = torch.zeros(1, prompt_len, dtype=torch.long)
    with torch.no_grad():
        prefill = torch.export.export(
            _LM(model),
            (prompt, torch.arange(prompt_len)),
            dynamic_shapes=({1: seq}, {0: seq}),
        )
        decode = torch.export.export(
            _LM(model), (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]))
        )
    model.reset_cache()  # export may have traced through the in-place updates
    return {"prefill": prefill, "decode": decode}


def speech_exports(model: SpeechEncoderDecoder, frames: int = 16) -> dict[str, Any]:
    """``encoder`` (features -> audio embeddings), ``token_embedding`` (one token),
    ``prefill`` (the text decoder over embeddings of any length >= 2) and ``decode`` (the
    text decoder over one embedding) exported programs of ``model``. Lower with
    ``share_mutable_buffers`` so ``decode`` continues from the cache ``prefill`` filled."""
    cfg = model.cfg
    seq = torch.export.Dim("seq", min=2, max=cfg.max_seq)
    with torch.no_grad():
        encoder = torch.export.export(_Encoder(model), (torch.randn(1, cfg.mels, frames),))
        embedding = torch.export.export(
            _TokenEmbedding(model), (torch.zeros(1, 1, dtype=torch.long),)
        )
        prefill = torch.export.export(
            _TextDecoder(model),
            (torch.randn(1, 4, cfg.dim), torch.arange(4)),
            dynamic_shapes=({1: seq}, {0: seq}),
        )
        decode = torch.export.export(
            _TextDecoder(model), (torch.randn(1, 1, cfg.dim), torch.tensor([0]))
        )
    model.decoder.reset_cache()
    return {"encoder": encoder, "token_embedding": embedding, "prefill": prefill, "decode": decode}


def lower_methods(
    exports: dict[str, Any],
    *,
    target: str = HOST.name,
    share_weights: bool | None = None,
    share_mutable_buffers: bool = False,
    runtime: str | None = None,
):
    """Lower several exported methods into one program with the Metal partitioner;
    returns the ``ExecutorchProgramManager``.

    ``share_weights``: store each constant once across methods (None: the partitioner's
    default, which shares for ``host``; False keeps upstream's one blob per partition);
    ``share_mutable_buffers``: the methods read and write one copy of each mutable
    buffer with the same name (a KV cache ``prefill`` fills and ``decode`` reads);
    ``runtime``: the partitioner's (None: the target's default).
    """
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from etmetal.backend.compile_specs import SHARE_MUTABLE_BUFFERS_KEY, SHARE_WEIGHTS_KEY
    from etmetal.backend.metal_partitioner import MetalPartitioner
    from etmetal.layout.config import backend_config

    specs = []
    if share_weights is not None:
        specs.append(CompileSpec(SHARE_WEIGHTS_KEY, b"1" if share_weights else b"0"))
    if share_mutable_buffers:
        specs.append(CompileSpec(SHARE_MUTABLE_BUFFERS_KEY, b"1"))
    partitioners = {
        name: [
            MetalPartitioner(
                [*specs, CompileSpec("method_name", name.encode())],
                target=target,
                **({} if runtime is None else {"runtime": runtime}),
            )
        ]
        for name in exports
    }
    edge = to_edge_transform_and_lower(exports, partitioner=partitioners)
    return edge.to_executorch(backend_config())


def greedy(prefill, decode, prompt: torch.Tensor, steps: int) -> list[int]:
    """Greedy tokens: ``prefill(tokens, input_pos)`` once on ``prompt`` (1, P), then
    ``steps`` calls of ``decode(token (1, 1), input_pos (1,))``; each returns logits."""
    n = prompt.shape[1]
    with torch.no_grad():  # eager updates of the cache must not record autograd history
        token = int(prefill(prompt, torch.arange(n)).argmax(-1))
        tokens = [token]
        for i in range(steps):
            logits = decode(torch.tensor([[token]]), torch.tensor([n + i]))
            token = int(logits.argmax(-1))
            tokens.append(token)
    return tokens


def greedy_with_logits(
    prefill, decode, prompt: torch.Tensor, steps: int
) -> tuple[list[int], list[torch.Tensor]]:
    """``greedy``, also returning each call's logits, cloned (a runtime may hand out the
    same output tensor at every call)."""
    logits: list[torch.Tensor] = []

    def keep(method):
        def call(tokens, pos):
            logits.append(method(tokens, pos).clone())
            return logits[-1]

        return call

    return greedy(keep(prefill), keep(decode), prompt, steps), logits


def eager_greedy(model: DecoderLM, prompt: torch.Tensor, steps: int) -> tuple[list[int], list]:
    """``greedy_with_logits`` of the eager model, from an empty KV cache and leaving one."""
    model.reset_cache()
    try:
        return greedy_with_logits(model, model, prompt, steps)
    finally:
        model.reset_cache()
