"""A method that is one delegate call runs directly on the caller's tensors (direct_delegate)."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from torch import nn

from etmetal.examples.metal_registry import get_model_and_inputs
from etmetal.runtime import ExecutionError, InputError, Runtime

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


def test_a_method_nobody_holds_runs_through_its_direct_call(linear):
    """``load_method(...).execute(...)`` on a temporary method: the call itself keeps the
    method alive (the prepared call holds it only weakly)."""
    program = load(linear.pte, trust_native_code=True)
    for seed in range(3):
        inputs = _fresh_inputs(linear.inputs, seed)
        [got] = program.load_method("forward").execute(inputs)
        torch.testing.assert_close(got, linear.module(*inputs))
    method = program.load_method("forward")
    assert method._direct is not None and method._fast_execute is not None
    gone = weakref.ref(method)
    del method
    assert gone() is None  # still freed at once, without the collector


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


def _general_method(pte):
    """The same method on the general path (no direct call, no prepared call), for reference."""
    method = load(pte, trust_native_code=True).load_method("forward")
    method._direct = None
    assert method._fast_execute is None
    return method


def test_prepared_call_serves_executes_with_the_general_bits(linear):
    fast = load(linear.pte, trust_native_code=True).load_method("forward")
    general = _general_method(linear.pte)
    try:
        assert type(fast._fast_execute).__name__ == "FastRun"
        fast.execute(_fresh_inputs(linear.inputs, 0))  # the first run teaches the outputs
        served = fast._fast_execute.stats()["fast"]
        kept = []
        for seed in range(6):
            inputs = _fresh_inputs(linear.inputs, seed)
            got, ref = fast.execute(inputs), general.execute(inputs)
            for g, r in zip(got, ref):
                assert torch.equal(g, r) and g.stride() == r.stride() and g.dtype == r.dtype
            kept.append((got, linear.module(*inputs)))
        assert fast._fast_execute.stats()["fast"] - served == 6
        for got, want in kept:  # results stay the caller's
            torch.testing.assert_close(got[0], want)
    finally:
        fast.destroy()
        general.destroy()


def test_prepared_call_declines_to_the_general_errors_and_copies(linear):
    method = load(linear.pte, trust_native_code=True).load_method("forward")
    general = _general_method(linear.pte)
    try:
        (x,) = linear.inputs
        method.execute([x])
        declined = method._fast_execute.stats()["fallback"]
        # another layout of the planned shape: copied into the plan, the same result
        other = x.t().contiguous().t() if x.dim() == 2 else x[..., None].squeeze(-1)
        got = method.execute([other])
        assert torch.equal(got[0], general.execute([x])[0])
        assert torch.equal(method.execute(x)[0], general.execute(x)[0])  # a bare tensor
        for bad in ([x.double()], [torch.randn(x.shape[0] + 1, *x.shape[1:])], [x, x], ["x"]):
            with pytest.raises(InputError) as want:
                general.execute(bad)
            with pytest.raises(InputError) as have:
                method.execute(bad)
            assert str(have.value) == str(want.value)
        assert method._fast_execute.stats()["fallback"] - declined == 6
    finally:
        method.destroy()
        general.destroy()
    with pytest.raises(ExecutionError, match="destroyed"):
        method.execute([x])


class DynamicHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2.0


def test_prepared_call_serves_a_dynamic_shape_once_the_plan_has_it(lowered):
    """A method with a dynamic dimension plans its input at the upper bound; the first
    execute of a shape copies into the plan (resizing it), and from then on that shape is
    the plan's and is served in C, with the general path's bits. Another shape is copied
    again, then served again: the layouts checked are the plan's as they are now."""
    batch = torch.export.Dim("batch", min=2, max=64)
    low = lowered(
        "direct:dynamic_head",
        lambda: (DynamicHead(), (torch.randn(5, 8),), {"dynamic_shapes": {"x": {0: batch}}}),
    )
    method = load(low.pte, trust_native_code=True).load_method("forward")
    general = _general_method(low.pte)
    try:
        assert type(method._fast_execute).__name__ == "FastRun"
        kept = []
        for n in (3, 3, 3, 17, 17, 3, 64, 64):
            before = method._fast_execute.stats()
            x = torch.randn(n, 8)
            got, ref = method.execute([x]), general.execute([x])
            after = method._fast_execute.stats()
            assert torch.equal(got[0], ref[0]) and got[0].shape == (n, 6)
            kept.append((got[0], low.module(x).detach()))
            planned_in = method._direct._planned_in[0]
            assert planned_in.shape == (n, 8)  # the plan has this shape now, either way
            served = after["fast"] - before["fast"]
            assert served + after["fallback"] - before["fallback"] == 1
            kept[-1] += (served,)
        # served in C exactly when the shape was the previous execute's
        assert [s for *_, s in kept] == [0, 1, 1, 0, 1, 0, 0, 1]
        for got, want, _ in kept:  # every result stays the caller's
            torch.testing.assert_close(got, want)
        with pytest.raises(InputError):
            method.execute([torch.randn(65, 8)])
    finally:
        method.destroy()
        general.destroy()


def test_prepared_call_is_serialized_across_threads(linear):
    method = load(linear.pte, trust_native_code=True).load_method("forward")
    try:
        xs = [_fresh_inputs(linear.inputs, s) for s in range(4)]
        want = [linear.module(*x) for x in xs]
        bad: list[int] = []

        def work(k: int) -> None:
            for i in range(200):
                j = (i + k) % len(xs)
                if not torch.allclose(method.execute(xs[j])[0], want[j], atol=1e-5):
                    bad.append(i)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not bad
    finally:
        method.destroy()


def test_a_dropped_method_is_freed_at_once(linear):
    gc.disable()  # only reference counting may free it: the prepared call makes no cycle
    try:
        method = load(linear.pte, trust_native_code=True).load_method("forward")
        method.execute(list(linear.inputs))
        method.execute(list(linear.inputs))
        ref = weakref.ref(method)
        del method
        assert ref() is None
    finally:
        gc.enable()
