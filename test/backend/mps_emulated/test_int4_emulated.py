"""The registry's int4 modules on the emulated Metal device give torchao's result, computed
from the float weights with torchao's own quantizer (not through etmetal's packing)."""

from __future__ import annotations

import pytest
import torch

from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.testing.torchao_reference import int4_linear_reference

INT4 = [name for name, entry in REGISTRY.items() if entry.qlinear == "fpa4w"]


@pytest.mark.parametrize("name", INT4)
def test_int4_module_on_the_emulated_device_matches_torchao(name, lowered_mps):
    low = lowered_mps(f"registry:{name}", lambda: get_model_and_inputs(name))
    float_module, _ = get_model_and_inputs(name, quantize=False)
    group_size = REGISTRY[name].qlinear_group_size
    for x in (low.inputs[0], torch.randn(low.inputs[0].shape)):
        [got] = low.run([x])
        want = int4_linear_reference(float_module.linear, x, group_size)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
