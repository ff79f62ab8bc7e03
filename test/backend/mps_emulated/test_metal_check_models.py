"""Inductor's Metal kernels under the Metal checker: a handful of registry modules and the demo
models, lowered for ``mps_emulated``, run clean (a fault would fail the run) and still match
eager PyTorch; the whole set is ``etmetal regress metal-check``.

Also the known silent fault of the emulated target, an out-of-range embedding index: what the
checker can say about it."""

from __future__ import annotations

import pytest
import torch

from etmetal.examples.demo import DEMO_MODELS_BY_NAME, get_demo
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.shims import default_context
from etmetal.shims.emulated_mps import mps_device
from etmetal.shims.emulated_mps.msl import checked_accesses

# registry modules whose partitions carry generated Metal kernels (not only fallbacks)
REGISTRY_SAMPLE = ["split_cat", "conv1d_bias", "sdpa_strided", "narrow_last_dim"]
DEMOS = ["patch_embedding", "transformer_block"]


@pytest.fixture
def checking():
    """The default context's device in check mode; a fault fails the run."""
    previous = mps_device.set_metal_check(default_context(), "memcheck,racecheck")
    yield
    mps_device.set_metal_check(default_context(), previous)


def _runs_clean(low, atol: float, rtol: float) -> None:
    expected = low.expected()
    before = checked_accesses()
    got = low.run()
    assert checked_accesses() > before  # its Metal kernels ran the checked build
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", REGISTRY_SAMPLE)
def test_registry_module_runs_clean_under_the_checker(name, lowered_mps, checking):
    low = lowered_mps(f"registry:{name}", lambda: get_model_and_inputs(name))
    _runs_clean(low, REGISTRY[name].atol, REGISTRY[name].rtol)


@pytest.mark.parametrize("name", DEMOS)
def test_demo_model_runs_clean_under_the_checker(name, lowered_mps, checking):
    low = lowered_mps(f"demo:{name}", lambda: get_demo(name))
    _runs_clean(low, DEMO_MODELS_BY_NAME[name].atol, DEMO_MODELS_BY_NAME[name].rtol)


class Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 8)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx) * 2.0


def test_an_out_of_range_embedding_index_is_no_access_but_reads_as_nan(lowered_mps):
    torch.manual_seed(0)
    low = lowered_mps("check:embedding", lambda: (Embed(), (torch.tensor([[1, 2, 3, 4]]),)))
    bad = torch.tensor([[1, 12, 3, -20]])  # rows 1 and 3 are out of range
    ctx = default_context()
    previous = mps_device.set_metal_check(ctx, "memcheck,racecheck,report")
    try:
        before = checked_accesses()
        (got,) = low.run((bad,))
        assert checked_accesses() > before
        # Inductor's kernel tests the index and returns before loading or storing: the
        # checker sees no access outside any binding, so there is no fault to report
        assert mps_device.check_report(ctx) == []
    finally:
        mps_device.set_metal_check(ctx, previous)
    # the rows it skipped are memory nobody wrote: poisoned, they read as NaN
    assert got[0, [1, 3]].isnan().all()
    good = low.module.table.weight[torch.tensor([1, 3])] * 2.0
    torch.testing.assert_close(got[0, [0, 2]], good.detach())
