"""The Metal registry's float32 modules, lowered for ``mps_emulated`` and run through the
emulated Metal device (Metal kernels on the CPU, ``aoti_torch_mps_*`` fallbacks on ATen),
match eager PyTorch within upstream's tolerances."""

from __future__ import annotations

import pytest
import torch

from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.shims import default_context, memory_stats
from etmetal.shims.emulated_mps import mps_device


def _fresh_like(inputs, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in inputs)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_module_runs_on_the_emulated_device(name, lowered_mps):
    entry = REGISTRY[name]
    low = lowered_mps(f"registry:{name}", lambda: get_model_and_inputs(name))
    assert low.partitioner.report.kept_out == []  # the whole model is Metal code
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else _fresh_like(low.inputs, seed)
        expected = low.expected(inputs)
        got = low.run(inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype
            torch.testing.assert_close(g, e, atol=entry.atol, rtol=entry.rtol)
    assert memory_stats().storages == 0
    assert mps_device.live_mps_storages(default_context()) == 0
