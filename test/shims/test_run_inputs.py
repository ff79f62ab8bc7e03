"""``AotiModel.run`` reuses input descriptors: results must follow the caller's tensors exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.shims import AotiModel, memory_stats


class AddMul(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + y) - y.sum()


@pytest.fixture(scope="module")
def model():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    art = compile_exported_program(torch.export.export(AddMul(), (x, y)))
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as m:
        yield m


def _check(model, x, y):
    torch.testing.assert_close(model.run([x, y])[0], AddMul()(x, y), atol=1e-5, rtol=1e-5)


def test_same_tensors_updated_in_place(model):
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    for _ in range(5):
        _check(model, x, y)
        x.mul_(-1.5).add_(0.25)
        y.copy_(torch.randn(4, 8))


def test_new_tensors_views_and_aliases(model):
    big = torch.randn(10, 8)
    for start in range(5):
        _check(model, big[start : start + 4], torch.randn(4, 8))  # views at moving offsets
    x = torch.randn(4, 8)
    _check(model, x, x)  # one tensor passed twice
    for _ in range(20):  # many distinct tensors: the cache stays bounded and correct
        _check(model, torch.randn(4, 8), torch.randn(4, 8))
    assert len(model._runner._input_cache) <= 4 * model.num_inputs
    stats = memory_stats()  # the model has no constants: nothing may stay registered
    assert (stats.tensors, stats.storages) == (0, 0)


def test_mismatched_inputs_still_rejected(model):
    with pytest.raises(Exception, match="dim value|stride value|expected 2 inputs"):
        model.run([torch.randn(4, 8)])
    with pytest.raises(Exception, match="unmatched"):
        model.run([torch.randn(8, 4).t(), torch.randn(4, 8)])
    _check(model, torch.randn(4, 8), torch.randn(4, 8))
