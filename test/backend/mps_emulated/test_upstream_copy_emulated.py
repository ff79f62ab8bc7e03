"""The upstream-copy scenario on the Metal path: views with holes (chunk/split + cat) stay in their
parent ``mps`` storage, so what writes through them gives the right answer;
``materialize="upstream_copy"`` (upstream's copy-into-a-new-buffer) loses those writes.

On ``mps`` Inductor fuses an elementwise chunk + cat into one Metal kernel that reads
the packed buffer, so the writes through views come from the fallbacks: in
``ChunkMatmulCat`` the Metal wrapper has ``aoti_torch_mps_mm_out`` write each half of the
cat straight into a ``_reinterpret_tensor`` view (with holes) of the cat buffer.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etmetal.examples.strided_views import CASES_BY_NAME
from etmetal.shims import AotiModel, default_context, memory_stats
from etmetal.shims.emulated_mps import mps_device


class ChunkMatmulCat(nn.Module):
    """``a, b = linear(x).chunk(2, -1); cat([a @ w1, b @ w2], -1)``."""

    def __init__(self, features: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 2 * features)
        self.w1 = nn.Parameter(torch.randn(features, features))
        self.w2 = nn.Parameter(torch.randn(features, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.linear(x).chunk(2, dim=-1)
        return torch.cat([a @ self.w1, b @ self.w2], dim=-1)


UPSTREAM_COPY_CASES = (
    "chunk_cat",
    "chunk_matmul_cat",
    "rope_split_halves",
    "channels_last_chunk_cat",
)


def _case(name: str):
    torch.manual_seed(0)
    if name == "chunk_matmul_cat":
        return ChunkMatmulCat().eval(), (torch.randn(4, 16),)
    case = CASES_BY_NAME[name]
    return case.make_module().eval(), case.make_inputs()


@pytest.fixture
def poisoned_mps_memory():
    """Every emulated Metal buffer starts as 0xFF bytes (NaN): unwritten elements show."""
    default_context().allocator(mps_device.DEVICE_MPS).fill_byte = 0xFF
    yield
    default_context().allocator(mps_device.DEVICE_MPS).fill_byte = None


@pytest.mark.parametrize("name", UPSTREAM_COPY_CASES)
def test_views_with_holes_are_correct_on_the_emulated_device(name, lowered_mps):
    low = lowered_mps(f"upstream_copy:{name}", lambda: _case(name))
    (expected,) = low.expected()
    (got,) = low.run()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert memory_stats().storages == 0 and mps_device.live_mps_storages(default_context()) == 0


def test_upstream_copy_materialization_loses_the_chunk_cat_writes(emulated_so, poisoned_mps_memory):
    module, inputs = _case("chunk_matmul_cat")
    expected = module(*inputs).detach()
    so, weights = emulated_so(module, inputs)
    with AotiModel(so, weights, device="mps") as model:
        (ok,) = model.run(inputs)
    torch.testing.assert_close(ok, expected, atol=1e-5, rtol=1e-5)
    with AotiModel(so, weights, device="mps", materialize="upstream_copy") as model:
        (out,) = model.run(inputs)
    # both matmuls wrote into copies of their views: no element of the cat was written
    assert torch.isnan(out).all(), (
        "upstream_copy materialization should lose the writes through views"
    )
    assert memory_stats().storages == 0 and mps_device.live_mps_storages(default_context()) == 0
