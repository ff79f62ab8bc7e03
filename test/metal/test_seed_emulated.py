"""The seed scenario on the Metal path: views with holes (chunk/split + cat) stay in their
parent ``mps`` storage, so Metal kernels that write through them give the right answer;
``materialize="seed"`` (upstream's copy-into-a-new-buffer) loses those writes."""

from __future__ import annotations

import pytest
import torch

from etmetal.scripts.models.strided_views import CASES_BY_NAME
from etmetal.shims import AotiModel, memory_stats
from etmetal.shims.metal import mps_device

SEED_CASES = ("chunk_cat", "rope_split_halves", "channels_last_chunk_cat")


def _case(name: str):
    case = CASES_BY_NAME[name]
    torch.manual_seed(0)
    return case.make_module().eval(), case.make_inputs()


@pytest.fixture
def poisoned_mps_memory():
    """Every emulated Metal buffer starts as 0xFF bytes (NaN): unwritten elements show."""
    mps_device.MPS_ALLOCATOR.fill_byte = 0xFF
    yield
    mps_device.MPS_ALLOCATOR.fill_byte = None


@pytest.mark.parametrize("name", SEED_CASES)
def test_views_with_holes_are_correct_on_the_emulated_device(name, lowered_mps):
    low = lowered_mps(f"seed:{name}", lambda: _case(name))
    (expected,) = low.expected()
    (got,) = low.run()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert memory_stats().storages == 0 and mps_device.live_mps_storages() == 0


def test_seed_materialization_loses_the_chunk_cat_writes(emulated_so, poisoned_mps_memory):
    module, inputs = _case("chunk_cat")
    expected = module(*inputs).detach()
    so, weights = emulated_so(module, inputs)
    with AotiModel(so, weights, device="mps") as model:
        (ok,) = model.run(inputs)
    torch.testing.assert_close(ok, expected, atol=1e-5, rtol=1e-5)
    with AotiModel(so, weights, device="mps", materialize="seed") as model:
        (out,) = model.run(inputs)
    lost = torch.isnan(out) | ~torch.isclose(out, expected, atol=1e-3, rtol=1e-3)
    assert lost.any(), "seed materialization on mps should lose the writes through the views"
    assert memory_stats().storages == 0 and mps_device.live_mps_storages() == 0
