"""Hand-written Metal kernels run by etmetal's MSL executor, checked against numpy/torch.

Each test targets one piece of Metal's execution model or of the compatibility header: the
expected values come from an independent host computation, never from the executor.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from etmetal.shims.emulated_mps import compile_library


def addr(t: torch.Tensor) -> int:
    return t.data_ptr()


def slot(value: int, ctype=ctypes.c_long):
    """A by-reference scalar argument: the slot must outlive the dispatch."""
    return ctype(value)


ELEMENTWISE = """
#include <metal_stdlib>
using namespace metal;
kernel void axpy(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                 constant float* y [[buffer(2)]], constant float& a [[buffer(3)]],
                 constant long& n [[buffer(4)]], uint i [[thread_position_in_grid]]) {
  if (i >= n) return;
  out[i] = a * x[i] + metal::precise::exp(-metal::abs(y[i]));
}
"""


def test_elementwise_matches_torch_with_a_partial_tail_group():
    lib = compile_library(ELEMENTWISE)
    assert lib.kernel_names == ("axpy",)
    fn = lib.function("axpy")
    assert fn.buffer_indices == (0, 1, 2, 3, 4)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    out = torch.full((1000,), float("nan"))
    a, n = ctypes.c_float(1.5), slot(1000)
    fn.dispatch(
        {0: addr(out), 1: addr(x), 2: addr(y), 3: ctypes.addressof(a), 4: ctypes.addressof(n)},
        threads=(1000,),
        group=(96,),
    )
    torch.testing.assert_close(out, 1.5 * x + torch.exp(-y.abs()))


POSITIONS = """
#include <metal_stdlib>
using namespace metal;
kernel void where_am_i(device uint* out [[buffer(0)]],
                       uint3 gid [[thread_position_in_grid]],
                       uint3 lid [[thread_position_in_threadgroup]],
                       uint3 tg [[threadgroup_position_in_grid]],
                       uint3 tptg [[threads_per_threadgroup]],
                       uint3 grid [[threads_per_grid]],
                       ushort flat [[thread_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]],
                       uint2 requested [[dispatch_threads_per_threadgroup]]) {
  uint i = (gid.z * grid.y + gid.y) * grid.x + gid.x;
  device uint* o = out + i * 14;
  o[0] = gid.x; o[1] = gid.y; o[2] = gid.z;
  o[3] = lid.x; o[4] = lid.y; o[5] = tg.x; o[6] = tg.y;
  o[7] = tptg.x; o[8] = tptg.y; o[9] = flat; o[10] = lane; o[11] = sg;
  o[12] = requested.x; o[13] = requested.y;
}
"""


def test_thread_positions_of_a_non_uniform_3d_grid():
    fn = compile_library(POSITIONS).function("where_am_i")
    T, G = (10, 7, 2), (4, 3, 1)
    out = torch.zeros(T[0] * T[1] * T[2] * 14, dtype=torch.int32)
    fn.dispatch({0: addr(out)}, threads=T, group=G)
    rec = out.view(T[2], T[1], T[0], 14).numpy()
    for z in range(T[2]):
        for y in range(T[1]):
            for x in range(T[0]):
                r = rec[z, y, x]
                tgx, tgy = x // G[0], y // G[1]
                # a partial (tail) threadgroup reports its actual size in threads_per_threadgroup,
                # the requested one in dispatch_threads_per_threadgroup
                sx, sy = min(G[0], T[0] - tgx * G[0]), min(G[1], T[1] - tgy * G[1])
                lx, ly = x % G[0], y % G[1]
                flat = lx + ly * sx
                assert list(r) == [
                    x,
                    y,
                    z,
                    lx,
                    ly,
                    tgx,
                    tgy,
                    sx,
                    sy,
                    flat,
                    flat % 32,
                    flat // 32,
                    *G[:2],
                ]


THREADGROUP_REVERSE = """
#include <metal_stdlib>
using namespace metal;
// Every thread writes threadgroup memory, waits, then reads another thread's element:
// without a shared array and a real barrier the result is wrong.
kernel void reverse_in_group(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                             uint gid [[thread_position_in_grid]],
                             uint lid [[thread_position_in_threadgroup]],
                             uint n [[threads_per_threadgroup]]) {
  threadgroup float tile[256];
  tile[lid] = in[gid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = tile[n - 1 - lid];
}
"""


def test_threadgroup_memory_is_shared_and_barriers_order_it():
    fn = compile_library(THREADGROUP_REVERSE).function("reverse_in_group")
    n, g = 1000, 256
    x = torch.arange(n, dtype=torch.float32)
    out = torch.zeros(n)
    fn.dispatch({0: addr(out), 1: addr(x)}, threads=(n,), group=(g,))
    expected = torch.cat([x[i : i + g].flip(0) for i in range(0, n, g)])
    torch.testing.assert_close(out, expected)


SIMD = """
#include <metal_stdlib>
using namespace metal;
kernel void simd_ops(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                     uint gid [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  float v = in[gid];
  device float* o = out + gid * 10;
  o[0] = simd_sum(v);
  o[1] = simd_max(v);
  o[2] = simd_prefix_exclusive_sum(v);
  o[3] = simd_shuffle_down(v, 1u);
  o[4] = simd_broadcast(v, 3);
  ulong vote = static_cast<ulong>(simd_ballot(v > 0.0f));
  o[5] = float(vote & 0xffffu);
  o[8] = float(vote >> 16);
  o[6] = simd_shuffle_and_fill_down(v, -1.0f, 4u);
  o[7] = simd_shuffle_xor(v, 1u);
  o[9] = float(simd_all(v > -100.0f)) + 2.0f * float(simd_ballot(v > -100.0f).all())
       + 4.0f * float(simd_any(v > 2.5f));
}
"""


def test_simd_group_operations_see_only_their_active_lanes():
    fn = compile_library(SIMD).function("simd_ops")
    n, g = 100, 50  # groups of 50 threads: SIMD groups of 32 and 18 lanes, and a tail group
    x = torch.randn(n, generator=torch.Generator().manual_seed(1)).float()
    x[x.abs() < 0.1] = 0.5
    out = torch.zeros(n * 10)
    fn.dispatch({0: addr(out), 1: addr(x)}, threads=(n,), group=(g,))
    got = out.view(n, 10).numpy().astype(np.float64)
    xs = x.numpy().astype(np.float64)
    for start in range(0, n, g):
        size = min(g, n - start)
        for s0 in range(0, size, 32):
            lanes = xs[start + s0 : start + min(s0 + 32, size)]
            k = len(lanes)
            for lane in range(k):
                r = got[start + s0 + lane]
                assert r[0] == pytest.approx(lanes.sum(), rel=1e-5, abs=1e-5)
                assert r[1] == lanes.max()
                assert r[2] == pytest.approx(lanes[:lane].sum(), rel=1e-5, abs=1e-5)
                # shuffle down: lane+1 (an inactive lane reads 0; past the group: own value)
                src = lane + 1
                assert r[3] == (lanes[src] if src < k else (0.0 if src < 32 else lanes[lane]))
                assert r[4] == (lanes[3] if k > 3 else 0.0)
                ballot = sum(1 << i for i, v in enumerate(lanes) if v > 0)
                assert (r[5], r[8]) == (ballot & 0xFFFF, ballot >> 16)
                src = lane + 4
                assert r[6] == (lanes[src] if src < k else (0.0 if src < 32 else -1.0))
                assert r[7] == (lanes[lane ^ 1] if (lane ^ 1) < k else 0.0)
                # all/any over the active lanes only (a partial group's missing lanes do not vote)
                assert r[9] == 1 + 2 + 4 * bool((lanes > 2.5).any())


HALF_BFLOAT = """
#include <metal_stdlib>
using namespace metal;
kernel void narrow(device half* h [[buffer(0)]], device bfloat* b [[buffer(1)]],
                   constant float* in [[buffer(2)]], device float* back [[buffer(3)]],
                   uint i [[thread_position_in_grid]]) {
  half hv = in[i];
  bfloat bv = in[i];
  h[i] = hv * half(3);
  b[i] = bv;
  back[2 * i] = float(hv);
  back[2 * i + 1] = float(bv);
}
"""


def test_half_and_bfloat_round_to_nearest_even_on_store():
    fn = compile_library(HALF_BFLOAT).function("narrow")
    x = torch.randn(300, generator=torch.Generator().manual_seed(2)) * 100
    h = torch.zeros(300, dtype=torch.float16)
    b = torch.zeros(300, dtype=torch.bfloat16)
    back = torch.zeros(600)
    fn.dispatch({0: addr(h), 1: addr(b), 2: addr(x), 3: addr(back)}, threads=(300,))
    assert torch.equal(h, x.half() * 3)
    assert torch.equal(b, x.bfloat16())
    assert torch.equal(back.view(300, 2)[:, 0], x.half().float())
    assert torch.equal(back.view(300, 2)[:, 1], x.bfloat16().float())


VECTORS = """
#include <metal_stdlib>
using namespace metal;
kernel void vectors(device float4* out [[buffer(0)]], constant float4* in [[buffer(1)]],
                    device int2* iout [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  float4 v = in[i];
  float4 r = float4(v.zw, v.x, 1.0f) * 2.0f + v.wzyx;
  r.xy = r.yx;
  float3 c = cross(v.xyz, float3(0, 0, 1));
  r.w += dot(v.xy, v.zw) + c.x;
  out[i] = select(r, -r, v > 0.0f);
  iout[i] = int2(v.xy) + int2(clz(uint(i + 1)), ctz(uint(i + 1)));
}
"""


def test_vector_types_swizzles_and_geometric_functions():
    fn = compile_library(VECTORS).function("vectors")
    n = 64
    v = torch.randn(n, 4, generator=torch.Generator().manual_seed(3))
    out = torch.zeros(n, 4)
    iout = torch.zeros(n, 2, dtype=torch.int32)
    fn.dispatch({0: addr(out), 1: addr(v), 2: addr(iout)}, threads=(n,))
    x, y, z, w = v.unbind(1)
    r = torch.stack([z * 2 + w, w * 2 + z, x * 2 + y, 2 + x], 1)
    r[:, [0, 1]] = r[:, [1, 0]]
    r[:, 3] += x * z + y * w + y  # cross(v.xyz, (0,0,1)).x == y
    torch.testing.assert_close(out, torch.where(v > 0, -r, r))
    idx = torch.arange(1, n + 1)
    clz = 32 - torch.floor(torch.log2(idx.double())).long() - 1
    ctz = torch.tensor([(int(k) & -int(k)).bit_length() - 1 for k in idx])
    assert torch.equal(iout[:, 0], v[:, 0].trunc().int() + clz.int())
    assert torch.equal(iout[:, 1], v[:, 1].trunc().int() + ctz.int())


ATOMICS_AND_TEMPLATES = """
#include <metal_stdlib>
using namespace metal;
template <typename T>
kernel void count_positive(device atomic_int* counter [[buffer(0)]],
                           constant T* in [[buffer(1)]],
                           device atomic<float>* total [[buffer(2)]],
                           uint i [[thread_position_in_grid]]) {
  if (in[i] > T(0)) atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(total, float(in[i]), memory_order_relaxed);
}
#define INSTANTIATE(T)                                                        \\
  template [[host_name("count_positive_" #T)]] kernel void count_positive<T>( \\
      device atomic_int* counter [[buffer(0)]], constant T* in [[buffer(1)]], \\
      device atomic<float>* total [[buffer(2)]], uint i [[thread_position_in_grid]]);
INSTANTIATE(float)
INSTANTIATE(int)
"""


def test_atomics_across_threadgroups_and_host_name_instantiations():
    lib = compile_library(ATOMICS_AND_TEMPLATES)
    assert sorted(lib.kernel_names) == ["count_positive_float", "count_positive_int"]
    n = 777
    for name, x in [
        ("count_positive_float", torch.randn(n, generator=torch.Generator().manual_seed(4))),
        ("count_positive_int", torch.randint(-50, 50, (n,), dtype=torch.int32)),
    ]:
        fn = lib.function(name)
        assert fn.buffer_indices == (0, 1, 2)
        counter = torch.zeros(1, dtype=torch.int32)
        total = torch.zeros(1)
        fn.dispatch({0: addr(counter), 1: addr(x), 2: addr(total)}, threads=(n,), group=(64,))
        assert int(counter) == int((x > 0).sum())
        torch.testing.assert_close(total, x.float().sum().reshape(1), rtol=1e-4, atol=1e-3)


C10_SPECIAL = """
#include <c10/metal/utils.h>
#include <c10/metal/reduction_utils.h>
#include <c10/metal/special_math.h>
#include <c10/metal/indexing.h>
#include <c10/metal/random.h>
#include <c10/metal/atomic.h>
#include <c10/metal/error.h>
#include <c10/metal/igamma.h>
kernel void special(device float* out [[buffer(0)]], constant float* x [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  float v = x[i];
  device float* o = out + i * 6;
  o[0] = c10::metal::erfinv(v * 0.9f);
  o[1] = c10::metal::i0(v);
  o[2] = c10::metal::digamma(metal::fabs(v) + 0.5f);
  o[3] = c10::metal::log1p(metal::fabs(v));
  o[4] = c10::metal::logaddexp(v, 0.5f * v);
  o[5] = c10::metal::floor_divide(v, 0.3f);
}
"""


def test_c10_metal_headers_compile_and_their_special_functions_match_torch():
    fn = compile_library(C10_SPECIAL).function("special")
    x = torch.rand(200, generator=torch.Generator().manual_seed(5)) * 2 - 1
    out = torch.zeros(200 * 6)
    fn.dispatch({0: addr(out), 1: addr(x)}, threads=(200,))
    o = out.view(200, 6)
    close = dict(rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(o[:, 0], torch.special.erfinv(x * 0.9), **close)
    torch.testing.assert_close(o[:, 1], torch.special.i0(x), **close)
    torch.testing.assert_close(o[:, 2], torch.special.digamma(x.abs() + 0.5), **close)
    torch.testing.assert_close(o[:, 3], torch.log1p(x.abs()), **close)
    torch.testing.assert_close(o[:, 4], torch.logaddexp(x, 0.5 * x), **close)
    torch.testing.assert_close(o[:, 5], torch.floor_divide(x, 0.3), **close)


def test_dispatches_from_several_os_threads_keep_their_threadgroup_memory_apart():
    import threading

    fn = compile_library(THREADGROUP_REVERSE).function("reverse_in_group")
    n, g = 1024, 256
    failures = []

    def work(seed: int) -> None:
        x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
        expected = torch.cat([x[i : i + g].flip(0) for i in range(0, n, g)])
        for _ in range(10):
            out = torch.zeros(n)
            fn.dispatch({0: addr(out), 1: addr(x)}, threads=(n,), group=(g,))
            if not torch.equal(out, expected):
                failures.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


# Inductor's Metal reductions write constants as bare literals (``auto eps = 1e-05;``) and hand
# the result to c10's templates next to float scratch memory: MSL types the literal float.
BARE_LITERALS = """
#include <c10/metal/reduction_utils.h>
kernel void mean_relu_plus_eps(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                               uint2 pos [[thread_position_in_grid]]) {
  threadgroup float scratch[2];
  auto eps = 1e-05;
  auto half_ = .5;
  auto t = c10::metal::max(in[pos.x * 64 + pos.y] + eps, 0.0);
  auto s = c10::metal::threadgroup_sum(scratch, t * (half_ + 0.5), pos.y, 64);
  out[pos.x] = s / 64.0;
}
"""


def test_bare_floating_literals_are_float_as_in_msl():
    fn = compile_library(BARE_LITERALS).function("mean_relu_plus_eps")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    out = torch.full((3,), float("nan"))
    fn.dispatch({0: addr(out), 1: addr(x)}, threads=(3, 64), group=(1, 64))
    torch.testing.assert_close(out, (x + 1e-05).clamp(min=0).mean(dim=1))
