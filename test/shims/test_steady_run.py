"""The steady-state run (``etm_run``): same results as eager on every run, whatever the path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.shims import AotiModel, memory_stats
from etmetal.shims.steady_run import COPY_LIMIT, SteadyResult

WIDE = COPY_LIMIT // 4  # float32 columns: one row of the wide output is past the copy limit


class ThreeOutputs(nn.Module):
    """A small output (copied out in C), a wide one (adopted), one from a fallback mm."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(16, 16))

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return torch.relu(x * 2 + 1), y * 3 - 1, x @ self.w


def _inputs(batch: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 16, generator=g), torch.randn(batch, WIDE, generator=g)]


@pytest.fixture(scope="module")
def module_and_model():
    module = ThreeOutputs().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(
        module, tuple(_inputs(4, 0)), dynamic_shapes=({0: batch}, {0: batch}), strict=False
    )
    art = compile_exported_program(ep)
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        model.artifact = art  # for tests that open a second model of the same .so
        yield module, model


def _expected(module, inputs):
    with torch.no_grad():
        return module(*inputs)


def test_every_run_matches_eager_and_results_stay_independent(module_and_model):
    module, model = module_and_model
    kept = []
    for seed in range(6):
        inputs = _inputs(4, seed)
        outs = model.run(inputs)
        kept.append((outs, _expected(module, inputs)))
    for outs, want in kept:  # later runs did not write into earlier results
        for o, w in zip(outs, want):
            torch.testing.assert_close(o, w, atol=1e-5, rtol=1e-5)
    assert len({o.data_ptr() for outs, _ in kept for o in outs}) == 3 * len(kept)


def test_changing_batch_and_inputs_in_place(module_and_model):
    module, model = module_and_model
    x, y = _inputs(4, 7)
    for batch in (4, 4, 9, 2, 9, 4):
        inputs = [x, y] if batch == 4 else _inputs(batch, batch)
        for o, w in zip(model.run(inputs), _expected(module, inputs)):
            torch.testing.assert_close(o, w, atol=1e-5, rtol=1e-5)
        x.mul_(-1.0).add_(0.5)  # same tensors, new values: the borrowed inputs follow


def test_outputs_written_into_caller_tensors(module_and_model):
    module, model = module_and_model
    inputs = _inputs(4, 3)
    model.run(inputs)  # the steady path knows the geometry now
    dsts = [torch.empty(4, 16), torch.empty(4, WIDE), torch.empty(4, 16)]
    ptrs = [d.data_ptr() for d in dsts]
    results = model.run_into(inputs, dsts)
    assert results[0] is None and results[1] is None  # native outputs copied in place
    want = _expected(module, inputs)
    for i, (d, r) in enumerate(zip(dsts, results)):
        torch.testing.assert_close(d if r is None else r, want[i], atol=1e-5, rtol=1e-5)
    # run(outputs=) places the rest itself, resizing for a new batch
    small = [torch.empty(2, 16), torch.empty(2, WIDE), torch.empty(2, 16)]
    inputs = _inputs(5, 4)
    model.run(inputs, outputs=small)
    for d, w in zip(small, _expected(module, inputs)):
        torch.testing.assert_close(d, w, atol=1e-5, rtol=1e-5)
    assert [d.data_ptr() for d in dsts] == ptrs


def test_failed_steady_run_leaks_nothing_and_recovers(module_and_model):
    module, model = module_and_model
    inputs = _inputs(4, 5)
    model.run(inputs)
    before = memory_stats()
    with pytest.raises(Exception, match="dim value|stride value|size|unmatched"):
        model.run([inputs[0].t().contiguous().t()[:, :8], inputs[1]])  # wrong width
    assert memory_stats().live() == before.live()
    for o, w in zip(model.run(inputs), _expected(module, inputs)):
        torch.testing.assert_close(o, w, atol=1e-5, rtol=1e-5)


def test_thousand_runs_keep_memory_flat(module_and_model):
    _, model = module_and_model
    inputs = _inputs(4, 6)
    for _ in range(20):
        model.run(inputs)
    before = memory_stats()
    for _ in range(1000):
        model.run(inputs)
    assert memory_stats().live() == before.live()


class PassThrough(nn.Module):
    """AOTI hands the stolen input handles back as outputs 0 and 2."""

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return x, y * 2, y


def test_inputs_handed_back_as_outputs_are_copied_out():
    x, y = torch.randn(3), torch.randn(4)
    art = compile_exported_program(torch.export.export(PassThrough(), (x, y)))
    before = memory_stats()
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        for _ in range(4):
            a, b, c = model.run([x, y])
            assert torch.equal(a, x) and torch.equal(b, y * 2) and torch.equal(c, y)
            # the caller's inputs are borrowed: outputs never alias them
            assert a.data_ptr() != x.data_ptr() and c.data_ptr() != y.data_ptr()
            x.add_(1.0)
    assert memory_stats().live() == before.live()


def test_a_steady_run_reports_a_named_result(module_and_model, monkeypatch):
    module, model = module_and_model
    inputs = _inputs(4, 11)
    model.run(inputs)  # the first run teaches the steady run the outputs
    steady = model._runner._ready
    seen = []
    real_run = steady.run

    def recording(*args):
        seen.append(real_run(*args))
        return seen[-1]

    monkeypatch.setattr(steady, "run", recording)
    for got, want in zip(model.run(inputs), _expected(module, inputs)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    [ran] = seen
    assert isinstance(ran, SteadyResult) and ran.rc == 0
    assert ran == (ran.rc, ran.results, ran.pending)  # a tuple still, its fields named
    assert len(ran.results) == 3


def test_a_dropped_model_closes_at_once_without_the_collector(module_and_model):
    """The run state is a collaborator that refers to its model weakly: dropping the last
    reference closes the model at once (no cycle waits for the garbage collector)."""
    import gc

    _, model = module_and_model
    art, ctx = model.artifact, model.context
    before = ctx.open_models
    gc.disable()
    try:
        other = AotiModel(art.so_path, art.weights_path.read_bytes())
        other.run(_inputs(4, 2))
        assert ctx.open_models == before + 1
        del other
        assert ctx.open_models == before
    finally:
        gc.enable()
