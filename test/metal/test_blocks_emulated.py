"""Llama- and ViT-like blocks run on the emulated Metal target as they do on host and in eager.

Each block is lowered twice (``host`` and ``mps_emulated``) and run through etmetal's
runtime; both must match eager PyTorch, and the emulated run must leave no live ``mps``
memory behind.
"""

from __future__ import annotations

import blocks
import pytest
import torch

from etmetal.scripts.export import lower
from etmetal.shims import memory_stats
from etmetal.shims.metal import mps_device

BLOCKS = {"llama": blocks.llama_block, "vit": blocks.vit_block}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_runs_on_the_emulated_target_as_on_host(name, lowered_mps):
    low = lowered_mps(f"block:{name}", BLOCKS[name])
    assert low.partitioner.report.kept_out == []
    (expected,) = low.expected()
    (emulated,) = low.run()
    torch.testing.assert_close(emulated, expected, atol=1e-4, rtol=1e-4)
    program, _ = lower(low.module, low.inputs, target="host")
    from etmetal.runtime import Runtime

    method = (
        Runtime.get().load_program(program.buffer, trust_native_code=True).load_method("forward")
    )
    try:
        (host,) = method.execute(list(low.inputs))
    finally:
        method.destroy()
    torch.testing.assert_close(emulated, host, atol=1e-4, rtol=1e-4)
    assert memory_stats().storages == 0 and mps_device.live_mps_storages() == 0
