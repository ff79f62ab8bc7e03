"""Hugging Face models with small configs (random weights, built locally: no hub), shared by
the delegate tests (etmetal's runtime) and the stock-runtime tests.

These are programs nobody here wrote: the decoders' position ids (a cumsum over a mask),
rotary embeddings, grouped-query attention and masks as transformers exports them.
``transformers`` is a test dependency: importing this module needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers

SEQ = 12
VOCAB = 128

# transformer sizes shrunk to seconds of compile (one layer still carries the position ids,
# rotary embeddings, grouped-query attention and masks the tests are about)
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4)

# name -> (config class, model class, config arguments, input batch): token-id models with
# transformers' default attention, lowered for ``host``
MODELS: dict[str, tuple[type, type, dict[str, Any], int]] = {
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(_SMALL, num_key_value_heads=2, max_position_embeddings=64),  # grouped-query
        1,
    ),
    "gpt2": (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(n_embd=64, n_layer=1, n_head=4, n_positions=64),
        1,
    ),
    "bert": (
        transformers.BertConfig,
        transformers.BertModel,
        dict(_SMALL, max_position_embeddings=64),
        2,
    ),
}

# name -> (config class, model class, config arguments, example input from a generator):
# HF's ``eager`` attention (matmul, scale, softmax, matmul: the pattern Inductor fuses into
# attention), the decoder's mask and position code (a cumsum), and a speech encoder's
# positional conv1d over a transposed input
EAGER_ATTENTION_MODELS: dict[str, tuple[type, type, dict[str, Any], Callable]] = {
    "llama_eager": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(_SMALL, num_key_value_heads=2, max_position_embeddings=64, vocab_size=VOCAB),
        lambda gen: torch.randint(0, VOCAB, (1, SEQ), generator=gen),
    ),
    "wav2vec2": (
        transformers.Wav2Vec2Config,
        transformers.Wav2Vec2Model,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4,
        ),
        lambda gen: torch.randn(1, 400, generator=gen),  # 400 samples -> 39 frames
    ),
}


class Logits(torch.nn.Module):
    """The model's main output as one tensor (no KV cache: one forward over the prompt)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.model, "lm_head"):
            return self.model(x, use_cache=False, return_dict=True).logits
        return self.model(x, return_dict=True).last_hidden_state


def build(name: str) -> tuple[Logits, tuple[torch.Tensor]]:
    """The model of ``MODELS``: seeded random weights, in eval mode, and its example input."""
    torch.manual_seed(0)
    config_class, model_class, config, batch = MODELS[name]
    model = model_class(config_class(vocab_size=VOCAB, **config))
    return Logits(model.eval()), (torch.randint(0, VOCAB, (batch, SEQ)),)


def build_eager_attention(name: str) -> tuple[Logits, tuple[torch.Tensor]]:
    """The model of ``EAGER_ATTENTION_MODELS`` with ``attn_implementation="eager"``."""
    torch.manual_seed(0)
    config_class, model_class, config, example = EAGER_ATTENTION_MODELS[name]
    model = model_class(config_class(attn_implementation="eager", **config)).eval()
    if model.config._attn_implementation != "eager":
        raise RuntimeError(f"{name}: transformers ignored attn_implementation='eager'")
    return Logits(model), (example(torch.Generator().manual_seed(0)),)
