"""Programs whose delegates call the fallbacks generated from torch's headers (pools,
scans, the LSTM layer kernel), lowered for ``host`` and run by the stock ExecuTorch
runtime: before, each failed there (no native path); now each matches eager."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import etmetal.stock_runtime as stock

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_matches, fresh_like  # noqa: E402


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


CASES = {
    "avg_pool2d": lambda: (
        _Fn(lambda x: torch.nn.functional.avg_pool2d(x, 6, 2)),
        (torch.randn(1, 2, 12, 12),),
    ),
    "avg_pool3d": lambda: (
        _Fn(lambda x: torch.nn.functional.avg_pool3d(x, 3, 2)),
        (torch.randn(1, 2, 6, 6, 6),),
    ),
    "adaptive_avg_pool3d": lambda: (
        _Fn(lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (2, 2, 2))),
        (torch.randn(1, 2, 5, 7, 9),),
    ),
    "cumsum_int": lambda: (_Fn(lambda x: torch.cumsum(x, 1) * 3), (torch.randint(0, 9, (3, 70)),)),
    "lstm": lambda: (nn.LSTM(8, 16, batch_first=True).eval(), (torch.randn(2, 5, 8),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_generated_fallback_runs_in_the_stock_runtime_and_matches_eager(
    name, stock_lowered, trusted
):
    low = stock_lowered(f"generated:{name}", CASES[name])
    assert low.partitioner.report.kept_out == []
    for seed in (0, 1):
        inputs = low.inputs if seed == 0 else fresh_like(low.inputs, seed)
        with torch.no_grad():
            expected = low.module(*inputs)
        flat = expected if isinstance(expected, tuple) else (expected,)
        flat = [w for x in flat for w in (x if isinstance(x, tuple) else (x,))]
        assert_matches(low.execute(inputs), flat, 1e-5, 1e-5)
    counts = stock.native_counts()
    assert (counts["delegates"], counts["live"]) == (0, 0)
