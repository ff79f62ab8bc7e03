"""Each way the emulated Metal device runs a kernel, forced and checked against numpy/torch.

- a kernel that never synchronises runs as a plain loop over a threadgroup's threads;
- one with a threadgroup barrier or a SIMD-group operation (also when reached only through a
  helper function) runs its threads as fibers;
- partial SIMD groups (threadgroups not a multiple of 32) and partial threadgroups;
- threadgroups spread over several OS threads (``torch.set_num_threads``).

Expected values are computed on the host from the kernel's intent, never by the executor.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from etmetal.shims.emulated_mps import MslError, compile_library


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def workers(request):
    """Threadgroups on the calling thread alone, then spread over a pool of two."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


# One position kernel twice: as written (no synchronisation: the loop path) and with a barrier
# every thread reaches (the fiber path). Both must write what Metal's model says.
POSITIONS = """
#include <metal_stdlib>
using namespace metal;
#define BODY                                                                      \\
  uint i = (gid.z * grid.y + gid.y) * grid.x + gid.x;                            \\
  device uint* o = out + i * 12;                                                 \\
  o[0] = gid.x; o[1] = gid.y; o[2] = gid.z; o[3] = lid.x; o[4] = lid.y;          \\
  o[5] = lid.z; o[6] = tg.x; o[7] = tg.y; o[8] = tg.z; o[9] = flat; o[10] = lane; \\
  o[11] = sg;
#define PARAMS device uint* out [[buffer(0)]], uint3 gid [[thread_position_in_grid]],   \\
  uint3 lid [[thread_position_in_threadgroup]], uint3 tg [[threadgroup_position_in_grid]], \\
  uint3 grid [[threads_per_grid]], uint flat [[thread_index_in_threadgroup]],        \\
  uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]
kernel void plain(PARAMS) { BODY }
kernel void with_barrier(PARAMS) { BODY threadgroup_barrier(mem_flags::mem_threadgroup); }
"""


def _positions(grid: tuple[int, int, int], group: tuple[int, int, int]) -> np.ndarray:
    """Metal's thread attributes for every thread of the grid, by row-major grid index."""
    z, y, x = np.meshgrid(*(np.arange(n) for n in grid[::-1]), indexing="ij")
    g = [x.ravel(), y.ravel(), z.ravel()]
    lid = [g[d] % group[d] for d in range(3)]
    tg = [g[d] // group[d] for d in range(3)]
    # the actual (possibly partial) size of each thread's threadgroup
    size = [np.minimum(group[d], grid[d] - tg[d] * group[d]) for d in range(3)]
    flat = (lid[2] * size[1] + lid[1]) * size[0] + lid[0]
    return np.stack([*g, *lid, *tg, flat, flat % 32, flat // 32], axis=1).astype(np.uint32)


@pytest.mark.parametrize("name,loop", [("plain", True), ("with_barrier", False)])
def test_both_paths_give_metals_thread_positions(name, loop, workers):
    fn = compile_library(POSITIONS).function(name)
    assert fn.runs_as_loop is loop and fn.synchronises is not loop
    grid, group = (37, 5, 3), (12, 2, 2)  # partial groups in every dimension; 48 threads
    out = torch.full((37 * 5 * 3 * 12,), -1, dtype=torch.int32)
    fn.dispatch({0: out.data_ptr()}, threads=grid, group=group)
    got = out.numpy().view(np.uint32).reshape(-1, 12)
    np.testing.assert_array_equal(got, _positions(grid, group))


ELEMENTWISE = """
#include <metal_stdlib>
using namespace metal;
kernel void scaled_tanh(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                        constant long& n [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  if (i >= n) return;
  out[i] = 3.0f * metal::precise::tanh(x[i]) - float(i % 7);
}
"""


def test_a_loop_kernel_over_many_threadgroups_matches_torch(workers):
    fn = compile_library(ELEMENTWISE).function("scaled_tanh")
    assert fn.runs_as_loop
    n = 100_003
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    out = torch.full((n,), float("nan"))
    count = ctypes.c_long(n)
    args = {0: out.data_ptr(), 1: x.data_ptr(), 2: ctypes.addressof(count)}
    fn.dispatch(args, threads=(n + 61,), group=(100,))  # the tail threads return early
    want = 3.0 * torch.tanh(x) - (torch.arange(n) % 7).float()
    torch.testing.assert_close(out, want)


# A barrier reached only through two levels of helper functions, and a SIMD operation reached
# through c10's reduction header: both must be classified as synchronising.
HELPERS = """
#include <metal_stdlib>
#include <c10/metal/reduction_utils.h>
using namespace metal;
inline void sync_all() { threadgroup_barrier(mem_flags::mem_threadgroup); }
template <typename T> inline T exchange_via(threadgroup T* buf, uint i, uint n, T v) {
  buf[i] = v;
  sync_all();
  return buf[n - 1 - i];
}
kernel void reverse_in_group(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                             uint gid [[thread_position_in_grid]],
                             uint lid [[thread_position_in_threadgroup]],
                             uint n [[threads_per_threadgroup]]) {
  threadgroup float buf[1024];
  out[gid] = exchange_via(buf, lid, n, x[gid]);
}
kernel void group_sum(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                      uint gid [[thread_position_in_grid]],
                      uint lid [[thread_position_in_threadgroup]],
                      uint n [[threads_per_threadgroup]]) {
  threadgroup float scratch[32];
  out[gid] = c10::metal::threadgroup_sum(scratch, x[gid], lid, n);
}
"""


@pytest.mark.parametrize("group", [48, 40, 64, 7])
def test_a_barrier_behind_helpers_reverses_each_threadgroup(group, workers):
    fn = compile_library(HELPERS).function("reverse_in_group")
    assert fn.synchronises and not fn.runs_as_loop
    n = group * 23 + group // 2  # many threadgroups, the last one partial
    x = torch.arange(n, dtype=torch.float32)
    out = torch.full((n,), float("nan"))
    fn.dispatch({0: out.data_ptr(), 1: x.data_ptr()}, threads=(n,), group=(group,))
    want = np.concatenate([c[::-1] for c in np.split(x.numpy(), range(group, n, group))])
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("group", [48, 96, 1024, 33])
def test_c10_threadgroup_sum_over_partial_simd_groups(group, workers):
    fn = compile_library(HELPERS).function("group_sum")
    assert fn.synchronises and not fn.runs_as_loop
    groups = 9
    n = group * groups
    x = torch.randint(-50, 50, (n,), generator=torch.Generator().manual_seed(2)).float()
    out = torch.full((n,), float("nan"))
    fn.dispatch({0: out.data_ptr(), 1: x.data_ptr()}, threads=(n,), group=(group,))
    sums = x.view(groups, group).sum(dim=1, keepdim=True)  # integers: exact in any order
    torch.testing.assert_close(out.view(groups, group), sums.expand(groups, group))


SIMD = """
#include <metal_stdlib>
using namespace metal;
kernel void lanes(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                  uint gid [[thread_position_in_grid]]) {
  float v = x[gid];
  out[gid * 3 + 0] = simd_sum(v);
  out[gid * 3 + 1] = simd_prefix_exclusive_sum(v);
  out[gid * 3 + 2] = simd_shuffle_down(v, 1u);
}
"""


def test_simd_operations_over_full_and_partial_simd_groups(workers):
    fn = compile_library(SIMD).function("lanes")
    assert fn.synchronises and not fn.runs_as_loop
    group, groups = 40, 11  # per threadgroup: one SIMD group of 32 and one of 8 lanes
    n = group * groups
    x = torch.randint(-9, 9, (n,), generator=torch.Generator().manual_seed(3)).float()
    out = torch.full((n * 3,), float("nan"))
    fn.dispatch({0: out.data_ptr(), 1: x.data_ptr()}, threads=(n,), group=(group,))
    got = out.view(n, 3).numpy()
    want = np.empty((n, 3), dtype=np.float32)
    xs = x.numpy()
    for start in range(0, n, group):
        for s0 in range(start, start + group, 32):  # SIMD groups restart in each threadgroup
            lanes = xs[s0 : min(s0 + 32, start + group)]
            want[s0 : s0 + len(lanes), 0] = lanes.sum()
            want[s0 : s0 + len(lanes), 1] = np.concatenate([[0], np.cumsum(lanes)[:-1]])
            # the last lane's source is past the SIMD group (or an inactive lane of a partial
            # one): Metal leaves that value undefined, so it is not compared
            want[s0 : s0 + len(lanes), 2] = np.concatenate([lanes[1:], [np.nan]])
    defined = ~np.isnan(want)
    assert defined.sum() == n * 3 - groups * 2
    np.testing.assert_array_equal(got[defined], want[defined])


DEADLOCK_IN_ONE = """
#include <metal_stdlib>
using namespace metal;
kernel void one_bad_group(device float* out [[buffer(0)]],
                          uint tg [[threadgroup_position_in_grid]],
                          uint lid [[thread_position_in_threadgroup]]) {
  if (tg == 5 && lid == 3) return;  // this thread never reaches the barrier
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tg * 64 + lid] = 1.0f;
}
"""


def test_a_failing_threadgroup_is_named_when_threadgroups_run_in_parallel(workers):
    fn = compile_library(DEADLOCK_IN_ONE).function("one_bad_group")
    out = torch.zeros(64 * 16)
    with pytest.raises(MslError, match=r"threadgroup \(5, 0, 0\): deadlock: 63 of 64 threads"):
        fn.dispatch({0: out.data_ptr()}, threads=(64 * 16,), group=(64,))
    # the pool and this thread serve the next dispatch normally
    fn2 = compile_library(ELEMENTWISE).function("scaled_tanh")
    x, y, n = torch.zeros(500), torch.full((500,), float("nan")), ctypes.c_long(500)
    fn2.dispatch({0: y.data_ptr(), 1: x.data_ptr(), 2: ctypes.addressof(n)}, (500,), (64,))
    torch.testing.assert_close(y, -(torch.arange(500) % 7).float())


# A barrier called through a function pointer set outside any function: no name in the
# kernel leads to it, so the classification (by name) takes the kernel for barrier-free. The
# dispatcher must stop such a thread with an error, not let it run on without its siblings.
HIDDEN_BARRIER = """
#include <metal_stdlib>
using namespace metal;
void (*hidden_sync)(mem_flags) = threadgroup_barrier;
kernel void hidden(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = 1.0f;
  hidden_sync(mem_flags::mem_threadgroup);
}
"""


def test_a_barrier_the_classification_cannot_see_is_an_error(workers):
    fn = compile_library(HIDDEN_BARRIER).function("hidden")
    assert fn.runs_as_loop
    out = torch.zeros(256)
    with pytest.raises(MslError, match="kernel 'hidden'.*classified as never synchronising"):
        fn.dispatch({0: out.data_ptr()}, threads=(256,), group=(64,))
