"""Every Metal registry module and every demo model, lowered for ``host`` and for
``mps_emulated`` (Inductor's Metal program, run on the emulated Metal device), run by the
stock ExecuTorch runtime through etmetal's native MetalBackend, matches eager PyTorch; so
does a program in upstream's one-blob weights layout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import etmetal.stock_runtime as stock
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.testing.pte_blobs import metal_delegates

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_matches, fresh_like  # noqa: E402

# the targets the stock backend runs: host C++, and the Metal program on the emulated device
TARGETS = ("host", "mps_emulated")


def _on(target: str, make):
    """``make`` for ``stock_lowered``, lowering for ``target``."""
    return lambda: (*make()[:2], {"target": target})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_module_matches_eager(name, target, stock_lowered, trusted):
    entry = REGISTRY[name]
    low = stock_lowered(
        f"registry:{name}:{target}", _on(target, lambda: get_model_and_inputs(name))
    )
    assert low.partitioner.report.kept_out == []  # the whole model runs in the delegate
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else fresh_like(low.inputs, seed)
        with torch.no_grad():
            expected = low.module(*inputs)
        assert_matches(low.execute(inputs), expected, entry.atol, entry.rtol)
    counts = stock.native_counts()
    assert (counts["delegates"], counts["live"], counts["stores"]) == (0, 0, 0)
    assert counts["mps_storages"] == 0  # the emulated device's memory went with it


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", [m.name for m in DEMO_MODELS])
def test_demo_model_matches_eager(name, target, stock_lowered, trusted):
    low = stock_lowered(f"demo:{name}:{target}", _on(target, lambda: get_demo(name)))
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else fresh_like(low.inputs, seed)
        with torch.no_grad():
            expected = low.module(*inputs)
        assert_matches(low.execute(inputs), expected, 1e-4, 1e-4)
    assert stock.native_counts()["delegates"] == 0


def test_upstream_one_blob_layout_matches_eager(stock_lowered, trusted):
    make = lambda: (*get_demo("transformer_block"), {"runtime": "upstream"})  # noqa: E731
    low = stock_lowered("demo:transformer_block:upstream", make)
    assert all(d.layout == "one_blob" for d in metal_delegates(low.pte))
    with torch.no_grad():
        expected = low.module(*low.inputs)
    assert_matches(low.execute(low.inputs), expected, 1e-4, 1e-4)
    counts = stock.native_counts()  # the container's constants went with it
    assert (counts["delegates"], counts["live"], counts["stores"]) == (0, 0, 0)


class CumulativeSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=1) * 2


def test_a_scan_fallback_is_served_natively_and_matches_eager(stock_lowered, trusted):
    # aoti_torch_cpu_cumsum was Python's only; its generated native path
    # (shims.fallback_codegen) now serves it here, with no Python to fall back on
    low = stock_lowered("native:cumsum", lambda: (CumulativeSum(), (torch.randn(4, 64),)))
    with torch.no_grad():
        expected = low.module(*low.inputs)
    assert_matches(low.execute(low.inputs), expected, 1e-5, 1e-5)
    assert stock.native_counts()["delegates"] == 0


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.lin(x)) * 2


def test_dynamic_outputs_are_resized_to_what_the_so_returns(stock_lowered, trusted):
    def make():
        torch.manual_seed(4)
        batch = torch.export.Dim("batch", min=1, max=16)
        return Scaled(), (torch.randn(16, 8),), {"dynamic_shapes": ({0: batch},)}

    low = stock_lowered("dynamic:scaled", make)
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(low.pte).load_method("forward")
    for rows in (3, 16, 2, 7):  # smaller than, equal to, then smaller than the upper bound
        x = torch.randn(rows, 8)
        [got] = method.execute([x])
        with torch.no_grad():
            expected = low.module(x)
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
