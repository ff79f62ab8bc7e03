"""The split path (msl_split.py): synchronising kernels run as loops between their barriers.

Each test forces one shape of kernel and compares the split run with numpy (the kernel's
intent, computed on the host) and with the same library built without splitting
(``compile_library(..., split=False)``: every thread a fiber), bit for bit:

- top-level barriers over threadgroup memory, with partial threadgroups;
- SIMD-group operations at the top level (their statements run on fibers, the rest in loops),
  with partial SIMD groups;
- a barrier inside a helper whose barriers stand at its own top level (a uniform helper: no
  fiber at all), once with arguments every thread shares and once with its own;
- a barrier inside a loop (that statement on fibers);
- what stays on fibers, with its reason: a return before a barrier; and a barrier not every
  thread reaches, which is the same deadlock error on both paths;
- Inductor's real reduction kernels (c10's threadgroup_sum/max/argmax and Welford helpers).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from etmetal.shims.emulated_mps import MslError, compile_library

sys.path.insert(0, str(Path(__file__).parent))
from inductor_cases import CASES, inputs  # noqa: E402
from test_inductor_kernels import DATA, library_source, run_case  # noqa: E402


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def workers(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _both(source: str, name: str):
    """The kernel split, and the same kernel on fibers."""
    return compile_library(source).function(name), compile_library(source, split=False).function(
        name
    )


def _run(fn, outs: list[torch.Tensor], ins: list[torch.Tensor], threads, group) -> None:
    args = {i: t.data_ptr() for i, t in enumerate(outs + ins)}
    fn.dispatch(args, threads=threads, group=group)


REVERSE = """
#include <metal_stdlib>
using namespace metal;
kernel void reverse_in_group(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                             uint i [[thread_position_in_grid]],
                             uint lid [[thread_position_in_threadgroup]],
                             uint n [[threads_per_threadgroup]]) {
  threadgroup float tile[64];
  float v = x[i] * 2.0f;
  tile[lid] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float mine = tile[n - 1 - lid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  tile[lid] = mine + v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = tile[(lid + 1) % n];
}
"""


def test_top_level_barriers_split_into_loops_with_partial_threadgroups(workers):
    split, fibers = _both(REVERSE, "reverse_in_group")
    assert split.path == "split" and split.path_reason == ""
    assert fibers.path == "fibers" and fibers.path_reason == "splitting turned off"
    n, group = 150, 64  # the last threadgroup has 22 threads
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    got, ref = torch.zeros(n), torch.zeros(n)
    _run(split, [got], [x], (n,), (group,))
    _run(fibers, [ref], [x], (n,), (group,))
    want = np.zeros(n, np.float32)
    xv = x.numpy() * np.float32(2)
    for s in range(0, n, group):
        blk = xv[s : s + group]
        mixed = blk[::-1] + blk
        want[s : s + len(blk)] = np.roll(mixed, -1)
    np.testing.assert_array_equal(got.numpy(), want)
    assert torch.equal(got, ref)


SIMD = """
#include <metal_stdlib>
using namespace metal;
kernel void simd_mix(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                     uint i [[thread_position_in_grid]],
                     uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float tile[64];
  tile[lane] = x[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);  // a cut: the rest of the kernel is split
  float v = x[i] + 1.0f;
  float s = simd_sum(v);
  float first = simd_broadcast(v, 0);
  float down = simd_shuffle_down(v, 1);
  out[3 * i] = s;
  out[3 * i + 1] = first;
  out[3 * i + 2] = down + float(lane);
}
"""


def test_simd_operations_run_on_fibers_between_loops_with_partial_simd_groups(workers):
    split, fibers = _both(SIMD, "simd_mix")
    assert split.path == "split"
    assert "simd_sum" in split.path_reason and "on fibers" in split.path_reason
    n, group = 100, 45  # SIMD groups of 32 and 13 lanes; a last threadgroup of 10 threads
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    got, ref = torch.zeros(3 * n), torch.zeros(3 * n)
    _run(split, [got], [x], (n,), (group,))
    _run(fibers, [ref], [x], (n,), (group,))
    assert torch.equal(got, ref)
    v = x.numpy() + np.float32(1)
    want = np.zeros((n, 3), np.float32)
    for s in range(0, n, group):
        for a in range(s, min(s + group, n), 32):
            b = min(a + 32, s + group, n)
            lanes = v[a:b]
            for j in range(b - a):
                want[a + j, 0] = lanes.sum(dtype=np.float32)
                want[a + j, 1] = lanes[0]
                # past the group's 32 lanes: the lane's own value; an inactive lane of a
                # partial group reads as zero (msl_sync.h's choice, what Apple GPUs give)
                src = lanes[j + 1] if j + 1 < b - a else (0 if j + 1 < 32 else lanes[j])
                want[a + j, 2] = src + j
    np.testing.assert_allclose(got.numpy().reshape(n, 3), want, rtol=1e-6, atol=1e-6)


UNIFORM = """
#include <metal_stdlib>
using namespace metal;
// every thread reads what all wrote: its barriers stand at its own top level, it writes nothing
template <typename T>
float group_mean(threadgroup T* data, unsigned size) {
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float acc = 0;
  for (unsigned k = 0; k < size; ++k) acc += data[k];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return acc / size;
}
float weighted(threadgroup float* data, unsigned size, uint me) {
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float acc = 0;
  for (unsigned k = 0; k < size; ++k) acc += data[k] * float(k == me ? 2 : 1);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return acc;
}
kernel void centre(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                   uint i [[thread_position_in_grid]],
                   uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[40];
  float v = x[i];
  tile[lid] = v;
  auto mean = group_mean(tile, 40);
  float w = weighted(tile, 40, lid);
  out[2 * i] = v - mean;
  out[2 * i + 1] = w;
}
"""


def test_barriers_inside_uniform_helpers_need_no_fiber(workers):
    split, fibers = _both(UNIFORM, "centre")
    assert split.path == "split" and split.path_reason == ""  # no statement on fibers
    n, group = 120, 40
    x = torch.randn(n, generator=torch.Generator().manual_seed(2))
    got, ref = torch.zeros(2 * n), torch.zeros(2 * n)
    _run(split, [got], [x], (n,), (group,))
    _run(fibers, [ref], [x], (n,), (group,))
    assert torch.equal(got, ref)
    xv = x.numpy().reshape(-1, group).astype(np.float64)
    want = np.stack([xv - xv.mean(1, keepdims=True), xv.sum(1, keepdims=True) + xv], -1)
    np.testing.assert_allclose(got.numpy().reshape(-1, group, 2), want, rtol=1e-5, atol=1e-5)


TILED = """
#include <metal_stdlib>
using namespace metal;
kernel void running_sums(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                         constant uint& steps [[buffer(2)]],
                         uint i [[thread_position_in_grid]],
                         uint lid [[thread_position_in_threadgroup]],
                         uint n [[threads_per_threadgroup]]) {
  threadgroup float tile[32];
  float acc = 0;
  for (uint s = 0; s < steps; s++) {
    tile[lid] = x[i] * float(s + 1);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    acc += tile[(lid + s) % n];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);  // a cut: the rest of the kernel is split
  out[i] = acc;
}
"""


def test_barrier_inside_a_loop_runs_that_statement_on_fibers(workers):
    split, fibers = _both(TILED, "running_sums")
    assert split.path == "split" and "statement 3 (for" in split.path_reason
    n, group, steps = 70, 32, 5
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    k = torch.tensor([steps], dtype=torch.int32)
    got, ref = torch.zeros(n), torch.zeros(n)
    _run(split, [got], [x, k], (n,), (group,))
    _run(fibers, [ref], [x, k], (n,), (group,))
    assert torch.equal(got, ref)
    xv = x.numpy()
    want = np.zeros(n, np.float32)
    for s0 in range(0, n, group):
        size = min(group, n - s0)
        for lid in range(size):
            want[s0 + lid] = sum(xv[s0 + (lid + s) % size] * (s + 1) for s in range(steps))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


EARLY_RETURN = """
#include <metal_stdlib>
using namespace metal;
kernel void guarded(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                    constant uint& n [[buffer(2)]], uint i [[thread_position_in_grid]],
                    uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[32];
  if (i >= n) return;
  tile[lid] = x[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = tile[31 - lid];
}
kernel void half_barrier(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]]) {
  float v = float(lid);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[lid] = v;
}
"""


def test_a_return_before_a_barrier_stays_on_fibers_with_its_reason(workers):
    fn = compile_library(EARLY_RETURN).function("guarded")
    assert fn.path == "fibers" and fn.path_reason == "a return before a barrier (statement 2)"
    x = torch.arange(64, dtype=torch.float32)
    out = torch.zeros(64)
    n = torch.tensor([64], dtype=torch.int32)
    _run(fn, [out], [x, n], (64,), (32,))
    want = x.view(2, 32).flip(1).reshape(-1)
    assert torch.equal(out, want)


def test_a_barrier_not_every_thread_reaches_is_the_same_error_on_both_paths():
    split, fibers = _both(EARLY_RETURN, "half_barrier")
    assert split.path == "split" and "statement 3 (if" in split.path_reason
    out = torch.zeros(32)
    for fn in (split, fibers):
        with pytest.raises(MslError, match="deadlock") as err:
            _run(fn, [out], [], (32,), (32,))
        assert "half_barrier" in str(err.value)
    # the executor recovers: the next dispatch of a good kernel works
    fn = compile_library(REVERSE).function("reverse_in_group")
    x = torch.ones(64)
    got = torch.zeros(64)
    _run(fn, [got], [x], (64,), (64,))
    assert torch.equal(got, torch.full((64,), 4.0))


def test_the_paths_env_logs_each_kernel_and_its_path(monkeypatch, caplog):
    from etmetal.shims.emulated_mps import msl

    monkeypatch.setenv("ETMETAL_MSL_PATHS", "1")
    source = REVERSE + "\n// logged\n"
    monkeypatch.setattr(msl, "_libraries", {})
    with caplog.at_level(logging.WARNING, logger="etmetal.shims.emulated_mps.msl_compiler"):
        compile_library(source)
    assert "MSL kernel 'reverse_in_group' runs as split" in caplog.text


SYNCING = sorted(
    name
    for name, case in DATA["cases"].items()
    if any(
        "threadgroup" in lib["kernel"] or "simd_" in lib["kernel"]
        for lib in case["libraries"].values()
    )
)


@pytest.mark.parametrize("name", SYNCING)
def test_inductor_reductions_split_match_fibers_bit_for_bit_and_eager(name):
    xs = inputs(name)
    got = run_case(name, xs)
    ref = run_case(name, xs, split=False)
    for g, r in zip(got, ref):
        assert torch.equal(g, r) or (g.is_floating_point() and torch.equal(g.isnan(), r.isnan()))
    expected = CASES[name][0](*xs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    for g, e in zip(got, expected):
        if e.is_floating_point():
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(g, e)
    paths = {
        compile_library(library_source(lib)).function("generated_kernel").path
        for lib in DATA["cases"][name]["libraries"].values()
    }
    # every synchronising Inductor kernel is split, but argmax's (see below)
    assert "fibers" not in paths or name.startswith("argmax")


# Welford (uniform helpers) and c10's sum/max/min (lockstep SIMD groups): no fiber at all;
# argmax's threadgroup_argmax statement is the one left on fibers
NO_FIBERS = ["layer_norm", "layer_norm_small", "var_mean", "softmax", "rms_norm", "sum_dim0"]
NO_FIBERS += ["amax_dim0", "log_softmax_dim0", "half_softmax", "bf16_ops", "min_int64"]


@pytest.mark.parametrize("name", NO_FIBERS)
def test_inductor_reductions_run_without_any_fiber(name):
    for lib in DATA["cases"][name]["libraries"].values():
        fn = compile_library(library_source(lib)).function("generated_kernel")
        if fn.synchronises:
            assert fn.path == "split" and fn.path_reason == "", (name, fn.path_reason)


def test_a_kernel_whose_every_synchronising_statement_needs_fibers_stays_on_fibers():
    # splitting would only add loops around the same fibers (c10's threadgroup_argmax)
    (lib,) = DATA["cases"]["argmax"]["libraries"].values()
    fn = compile_library(library_source(lib)).function("generated_kernel")
    assert fn.path == "fibers"
    assert fn.path_reason.startswith("every synchronising statement needs fibers")
    assert "threadgroup_argm" in fn.path_reason


def _c10_threadgroup_sum() -> str:
    """c10's own threadgroup_sum definition, read from the installed torch (its body is what
    the split path recognises by digest)."""
    from c10_headers import C10_METAL

    text = (C10_METAL / "reduction_utils.h").read_text()
    start = text.index("template <typename T>\nopmath_t<T> threadgroup_sum(")
    depth, end = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start : end + 1]
        end += 1


# c10's threadgroup_sum over a SIMD sum of our own that makes `EXTRA` identity shuffles first:
# the lockstep replay serves up to 8 SIMD operations per call; past that the statement falls
# back to fibers, and both must give the threadgroup's sum.
OWN_SUM = """
#include <metal_stdlib>
using namespace metal;
namespace mine {
constexpr unsigned simdgroup_size = 32;
template <typename T>
using opmath_t = T;
template <typename T>
T simd_sum(T v) {
  for (int k = 0; k < EXTRA; k++) v = metal::simd_shuffle_xor(v, 0);
  return metal::simd_sum(v);
}
HELPER
}  // namespace mine
kernel void group_sums(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                       uint i [[thread_position_in_grid]],
                       uint lid [[thread_index_in_threadgroup]],
                       uint n [[threads_per_threadgroup]]) {
  threadgroup float scratch[32];
  float v = x[i] * 0.5f;
  auto total = mine::threadgroup_sum(scratch, v, lid, n);
  out[i] = total + float(lid);
}
"""


@pytest.mark.parametrize("extra", [3, 9], ids=["replayed", "falls-back"])
def test_c10_threadgroup_sum_in_lockstep_and_its_fallback_to_fibers(extra, workers):
    source = OWN_SUM.replace("EXTRA", str(extra)).replace("HELPER", _c10_threadgroup_sum())
    split, fibers = _both(source, "group_sums")
    assert split.path == "split" and split.path_reason == ""  # recognised: no fiber statement
    n, group = 300, 100  # SIMD groups of 32 and 4 lanes; a last threadgroup of 0 + 100 threads
    x = torch.randn(n, generator=torch.Generator().manual_seed(4))
    got, ref = torch.zeros(n), torch.zeros(n)
    _run(split, [got], [x], (n,), (group,))
    _run(fibers, [ref], [x], (n,), (group,))
    assert torch.equal(got, ref)
    halves = x.numpy().reshape(-1, group).astype(np.float64) * 0.5
    want = halves.sum(1, keepdims=True) + np.arange(group)
    np.testing.assert_allclose(got.numpy().reshape(-1, group), want, rtol=1e-5, atol=1e-5)


NAMES = """
#include <metal_stdlib>
using namespace metal;
kernel void shadowing(device float* a [[buffer(0)]], constant float* g [[buffer(1)]],
                      uint i [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[32];
  float t = g[i] + 1.0f;
  tile[lid] = t;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  a[i] = tile[31 - lid] * t;
}
"""


def test_a_kernels_own_names_never_collide_with_the_split_codes():
    # a buffer named `a`, one named `g`, a local `t`: the generated names all start with etm_
    split, fibers = _both(NAMES, "shadowing")
    assert split.path == "split" and split.path_reason == ""
    x = torch.randn(64, generator=torch.Generator().manual_seed(5))
    got, ref = torch.zeros(64), torch.zeros(64)
    _run(split, [got], [x], (64,), (32,))
    _run(fibers, [ref], [x], (64,), (32,))
    t = x + 1
    assert torch.equal(got, ref)
    assert torch.equal(got, t.view(2, 32).flip(1).reshape(-1) * t)
