"""Every Metal registry module and every strided-view model, lowered for this host and run
through etmetal's runtime and the MetalBackend delegate, matches eager PyTorch."""

from __future__ import annotations

import pytest
import torch

from etmetal.examples import strided_views
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.shims import memory_stats


def _fresh_like(inputs, seed: int) -> tuple[torch.Tensor, ...]:
    """New values with each example input's shape and layout (not the traced values)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        y = torch.randn(x.shape, generator=gen, dtype=x.dtype)
        channels_last = x.dim() == 4 and not x.is_contiguous()
        out.append(y.to(memory_format=torch.channels_last) if channels_last else y)
    return tuple(out)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_module_matches_eager(name, lowered):
    entry = REGISTRY[name]
    low = lowered(f"registry:{name}", lambda: get_model_and_inputs(name))
    assert low.partitioner.report.kept_out == []  # the whole model runs in the delegate
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else _fresh_like(low.inputs, seed)
        with torch.no_grad():
            expected = low.module(*inputs)
        expected = expected if isinstance(expected, (tuple, list)) else [expected]
        got = low.execute(inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype
            torch.testing.assert_close(g, e, atol=entry.atol, rtol=entry.rtol)
    assert memory_stats().storages == 0


@pytest.mark.parametrize("name", [c.name for c in strided_views.CASES])
def test_strided_view_model_matches_eager(name, lowered):
    case = strided_views.CASES_BY_NAME[name]

    def make():
        torch.manual_seed(0)
        return case.make_module(), case.make_inputs()

    low = lowered(f"strided:{name}", make)
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else _fresh_like(low.inputs, seed)
        with torch.no_grad():
            expected = low.module(*inputs)
        [got] = low.execute(inputs)
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert memory_stats().storages == 0
