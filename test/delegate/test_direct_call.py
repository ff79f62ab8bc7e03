"""A method that is one delegate call runs directly on the caller's tensors (direct_delegate)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etmetal.examples.metal_registry import get_model_and_inputs
from etmetal.runtime import InputError, Runtime

load = Runtime.get().load_program


class Mixed(nn.Module):
    """sort stays outside the delegate: two instructions, no direct call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(torch.relu(x * 2.0), dim=-1).values


@pytest.fixture
def linear(lowered):
    return lowered("registry:linear_bias", lambda: get_model_and_inputs("linear_bias"))


def _fresh_inputs(inputs, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in inputs]


def test_direct_results_equal_the_general_path_and_stay_independent(linear):
    direct = load(linear.pte, trust_native_code=True).load_method("forward")
    general = load(linear.pte, trust_native_code=True).load_method("forward")
    general._direct = None  # the planned-memory path, for reference
    assert direct._direct is not None
    try:
        planned = {direct._vals[i].data_ptr() for i in direct._outputs}
        kept = []
        for seed in range(5):
            inputs = _fresh_inputs(linear.inputs, seed)
            got, ref = direct.execute(inputs), general.execute(inputs)
            for g, r in zip(got, ref):
                assert torch.equal(g, r) and g.stride() == r.stride()
                assert g.data_ptr() not in planned  # returned, not planned, memory
            kept.append((got, linear.module(*inputs)))
        for got, want in kept:  # later executes did not overwrite earlier outputs
            torch.testing.assert_close(got[0], want)
    finally:
        direct.destroy()
        general.destroy()


def test_bad_inputs_get_the_general_errors(linear):
    method = load(linear.pte, trust_native_code=True).load_method("forward")
    try:
        (x,) = linear.inputs
        with pytest.raises(InputError, match="dtype"):
            method.execute([x.double()])
        with pytest.raises(InputError, match="static shape|must be"):
            method.execute([torch.randn(x.shape[0] + 1, *x.shape[1:])])
        with pytest.raises(InputError, match="takes 1 inputs"):
            method.execute([x, x])
        torch.testing.assert_close(method.execute([x])[0], linear.module(x))
    finally:
        method.destroy()


def test_mixed_programs_and_isolated_delegates_keep_the_general_path(lowered, linear):
    mixed = lowered("direct:mixed", lambda: (Mixed(), (torch.randn(3, 8),)))
    method = load(mixed.pte, trust_native_code=True).load_method("forward")
    try:
        assert method._direct is None
        x = torch.randn(3, 8)
        torch.testing.assert_close(method.execute([x])[0], Mixed()(x))
    finally:
        method.destroy()
    isolated = load(linear.pte, isolate=True, trust_native_code=True).load_method("forward")
    try:
        assert isolated._direct is None  # the worker's delegate writes into shared memory
        torch.testing.assert_close(
            isolated.execute(list(linear.inputs))[0], linear.module(*linear.inputs)
        )
    finally:
        isolated.destroy()
