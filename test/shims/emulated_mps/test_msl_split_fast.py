"""What makes split kernels cheap (msl_split.py, msl_split.h), each forced and compared with
the same library on fibers (``split=False``) bit for bit, and with numpy or torch:

- batches: a kernel whose only synchronising statement is c10's ``threadgroup_welford_reduce``
  over one threadgroup array (Inductor's layer norms) runs up to 8 threadgroups at once, each
  its regions with its own threadgroup memory, the reductions interleaved; a grid of one
  threadgroup (no batch), a full batch and a partial one, one shared between OS threads; then
  what is not batched;
- folds: c10's float threadgroup_max/min/sum computes each SIMD group's value at once, NaN
  lanes included;
- a uniform early return (Inductor's embedding bounds test) tested once per threadgroup, taken
  and not; a return that may differ between threads stays on fibers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from etmetal.shims.emulated_mps import compile_library

ROW = 40  # threads per threadgroup: one row each

NORM = """
#include <c10/metal/reduction_utils.h>
#include <metal_stdlib>
using namespace metal;
kernel void row_norm(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                     uint2 pos [[thread_position_in_grid]],
                     uint2 lid [[thread_position_in_threadgroup]],
                     uint2 tg [[threadgroup_position_in_grid]]) {
  threadgroup float acc[ROW];
  float v = x[pos.x * ROW + pos.y] * 1.5f;
  acc[lid.y] = v;
  auto w = c10::metal::threadgroup_welford_reduce(acc, ROW);
  out[pos.x * ROW + pos.y] = (v - w.x) / (w.y + 1.0f) + float(tg.x) + w.z;
}
""".replace("ROW", str(ROW))


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def workers(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _run(fn, rows: int, x: torch.Tensor) -> torch.Tensor:
    out = torch.full((rows, ROW), float("nan"))
    fn.dispatch({0: out.data_ptr(), 1: x.data_ptr()}, threads=(rows, ROW), group=(1, ROW))
    return out


def _reference(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64) * 1.5
    mean = v.mean(1, keepdims=True)
    m2 = ((v - mean) ** 2).sum(1, keepdims=True)
    return (v - mean) / (m2 + 1.0) + np.arange(len(x))[:, None] + ROW


# 1 threadgroup (no batch), 8 + 3 (a full batch and a partial one), and 450 threadgroups
# (18000 threads: shared between OS threads in batches when there are two)
@pytest.mark.parametrize("rows", [1, 11, 450])
# a top-level barrier is only a cut between two regions: batched too
@pytest.mark.parametrize("barrier", [False, True], ids=["", "with-a-barrier"])
def test_welford_threadgroups_in_batches_match_fibers_bit_for_bit(rows, barrier, workers):
    source = NORM
    if barrier:
        source = NORM.replace(
            "auto w = ", "threadgroup_barrier(mem_flags::mem_threadgroup);\n  auto w = "
        )
    batched = compile_library(source).function("row_norm")
    fibers = compile_library(source, split=False).function("row_norm")
    assert batched.path == "split" and batched.batched
    assert fibers.path == "fibers" and not fibers.batched
    x = torch.randn(rows, ROW, generator=torch.Generator().manual_seed(rows))
    got, ref = _run(batched, rows, x), _run(fibers, rows, x)
    assert torch.equal(got, ref)
    np.testing.assert_allclose(got.numpy(), _reference(x.numpy()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "change",
    [
        # a size that is not a literal
        (
            "threadgroup_welford_reduce(acc, ROW)",
            "threadgroup_welford_reduce(acc, uint(x[0] * 0) + ROW)",
        ),
        # a second reduction
        ("+ w.z;", "+ c10::metal::threadgroup_welford_reduce(acc, ROW).z;"),
    ],
    ids=["computed-size", "two-reductions"],
)
def test_what_is_not_batched_still_splits_and_matches_fibers(change):
    source = NORM.replace(change[0].replace("ROW", str(ROW)), change[1].replace("ROW", str(ROW)))
    split = compile_library(source).function("row_norm")
    fibers = compile_library(source, split=False).function("row_norm")
    assert split.path == "split" and not split.batched
    x = torch.randn(11, ROW, generator=torch.Generator().manual_seed(5))
    assert torch.equal(_run(split, 11, x), _run(fibers, 11, x))


# c10's threadgroup_max/min/sum of a float in lockstep: tg_reduce computes the SIMD operation's
# value at once (msl_split.h's fold_*) when c10's simd functions are the text it knows
REDUCE = """
#include <c10/metal/reduction_utils.h>
#include <metal_stdlib>
using namespace metal;
kernel void reduce_rows(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                        uint i [[thread_position_in_grid]],
                        uint lid [[thread_index_in_threadgroup]],
                        uint n [[threads_per_threadgroup]]) {
  threadgroup float scratch[32];
  float v = x[i];
  auto r = c10::metal::threadgroup_OP(scratch, v, lid, n);
  out[i] = r + float(lid);
}
"""


@pytest.mark.parametrize("op", ["max", "min", "sum"])
def test_c10_float_reductions_fold_at_once_and_match_fibers_with_nans(op, workers):
    source = REDUCE.replace("OP", op)
    split = compile_library(source).function("reduce_rows")
    fibers = compile_library(source, split=False).function("reduce_rows")
    assert split.path == "split" and split.path_reason == ""
    code = (split.library.path.parent / "library.cpp").read_text()
    assert f"tg_reduce<etm::split::fold_{op}>" in code
    n, group = 300, 100  # SIMD groups of 32 and 4 lanes; the last threadgroup is full
    x = torch.randn(n, generator=torch.Generator().manual_seed(7))
    x[150] = float("nan")  # one NaN in the middle threadgroup: max/min give NaN there
    got, ref = torch.zeros(n), torch.zeros(n)
    for fn, out in ((split, got), (fibers, ref)):
        fn.dispatch({0: out.data_ptr(), 1: x.data_ptr()}, threads=(n,), group=(group,))
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(got.nan_to_num(), ref.nan_to_num())
    rows = x.numpy().reshape(-1, group).astype(np.float64)
    want = {"max": np.max, "min": np.min, "sum": np.sum}[op](rows, 1, keepdims=True)
    np.testing.assert_allclose(got.numpy().reshape(-1, group), want + np.arange(group), rtol=1e-5)


# Inductor's embedding bounds test before a reduction: a return every thread of a threadgroup
# takes or none does (it reads only a read-only buffer), tested once per threadgroup
EXIT = """
#include <c10/metal/reduction_utils.h>
#include <metal_stdlib>
using namespace metal;
kernel void gather_norm(device float* out [[buffer(0)]], constant long* index [[buffer(1)]],
                        constant float* table [[buffer(2)]],
                        uint i [[thread_position_in_grid]],
                        uint lid [[thread_index_in_threadgroup]]) {
  threadgroup float scratch[1];
  auto row = index[0];
  auto first = table[lid];
  if ((row < 0 || row >= 4)) return;
  auto v = table[lid + 32 * row] + first;
  auto total = c10::metal::threadgroup_sum(scratch, v * v, lid, 32);
  out[i] = v / total;
}
"""


@pytest.mark.parametrize("row", [2, 7, -1], ids=["in-range", "past-the-end", "negative"])
def test_a_uniform_early_return_splits_and_matches_fibers(row, workers):
    split = compile_library(EXIT).function("gather_norm")
    fibers = compile_library(EXIT, split=False).function("gather_norm")
    assert split.path == "split" and split.path_reason == ""
    table = torch.randn(4 * 32, generator=torch.Generator().manual_seed(3))
    index = torch.tensor([row], dtype=torch.int64)
    got, ref = torch.full((64,), -5.0), torch.full((64,), -5.0)
    for fn, out in ((split, got), (fibers, ref)):
        args = {0: out.data_ptr(), 1: index.data_ptr(), 2: table.data_ptr()}
        fn.dispatch(args, threads=(64,), group=(32,))
    assert torch.equal(got, ref)
    if 0 <= row < 4:
        v = table.view(4, 32)[row] + table[:32]
        want = (v / (v * v).sum()).repeat(2)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:  # every thread returned: nothing stored
        assert torch.equal(got, torch.full((64,), -5.0))


@pytest.mark.parametrize(
    "cond",
    ["lid >= 4", "first > 100.0f", "(row = 1) > 3"],
    ids=["a-position", "a-value-per-thread", "an-assignment"],
)
def test_a_return_that_may_differ_between_threads_stays_on_fibers(cond):
    source = EXIT.replace("(row < 0 || row >= 4)", cond)
    fn = compile_library(source).function("gather_norm")
    assert fn.path == "fibers" and fn.path_reason.startswith("a return before a barrier")
