"""Llama- and ViT-like blocks (HF-style layers: RMSNorm, RoPE, GQA causal attention, SwiGLU;
patch embedding, class token, LayerNorm, attention, GELU MLP) lowered for ``mps_emulated``
and run through etmetal's runtime on the emulated Metal device match eager PyTorch, and
leave no live ``mps`` memory behind."""

from __future__ import annotations

import blocks
import pytest
import torch

from etmetal.shims import default_context, memory_stats
from etmetal.shims.emulated_mps import mps_device

BLOCKS = {"llama": blocks.llama_block, "vit": blocks.vit_block}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_runs_on_the_emulated_target(name, lowered_mps):
    low = lowered_mps(f"block:{name}", BLOCKS[name])
    assert low.partitioner.report.kept_out == []  # the whole block is Metal code
    for seed in (None, 1):
        inputs = None
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            inputs = tuple(torch.randn(x.shape, generator=gen) for x in low.inputs)
        (expected,) = low.expected(inputs)
        (got,) = low.run(inputs)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert memory_stats().storages == 0 and mps_device.live_mps_storages(default_context()) == 0
