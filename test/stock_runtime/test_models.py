"""Every Metal registry module and every demo model, lowered for ``host``, run by the stock
ExecuTorch runtime through etmetal's native MetalBackend, matches eager PyTorch; so does a
program in upstream's one-blob weights layout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import etmetal.stock_runtime as stock
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_matches, fresh_like  # noqa: E402


@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_module_matches_eager(name, stock_lowered, trusted):
    entry = REGISTRY[name]
    low = stock_lowered(f"registry:{name}", lambda: get_model_and_inputs(name))
    assert low.partitioner.report.kept_out == []  # the whole model runs in the delegate
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else fresh_like(low.inputs, seed)
        with torch.no_grad():
            expected = low.module(*inputs)
        assert_matches(low.execute(inputs), expected, entry.atol, entry.rtol)
    counts = stock.native_counts()
    assert (counts["delegates"], counts["live"], counts["stores"]) == (0, 0, 0)


@pytest.mark.parametrize("name", [m.name for m in DEMO_MODELS])
def test_demo_model_matches_eager(name, stock_lowered, trusted):
    low = stock_lowered(f"demo:{name}", lambda: get_demo(name))
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else fresh_like(low.inputs, seed)
        with torch.no_grad():
            expected = low.module(*inputs)
        assert_matches(low.execute(inputs), expected, 1e-4, 1e-4)
    assert stock.native_counts()["delegates"] == 0


def test_upstream_one_blob_layout_matches_eager(stock_lowered, trusted):
    make = lambda: (*get_demo("transformer_block"), {"runtime": "upstream"})  # noqa: E731
    low = stock_lowered("demo:transformer_block:upstream", make)
    with torch.no_grad():
        expected = low.module(*low.inputs)
    assert_matches(low.execute(low.inputs), expected, 1e-4, 1e-4)
