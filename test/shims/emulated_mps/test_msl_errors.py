"""Bad libraries and bad dispatches end in an MslError naming the kernel (and the construct or
argument): never a crash, a hang or a wrong answer."""

from __future__ import annotations

import pytest
import torch

from etmetal.shims.emulated_mps import MslError, compile_library

GOOD = """
#include <metal_stdlib>
using namespace metal;
kernel void copy(device float* out [[buffer(0)]], constant float* in [[buffer(2)]],
                 uint i [[thread_position_in_grid]]) {
  out[i] = in[i];
}
"""


def test_unknown_kernel_name():
    lib = compile_library(GOOD)
    with pytest.raises(MslError, match="'paste'.*not in the library.*'copy'") as e:
        lib.function("paste")
    assert e.value.kernel == "paste"


@pytest.mark.parametrize(
    "args, pattern",
    [
        ({0: 1}, r"kernel 'copy': no argument for \[\[buffer\(2\)\]\]"),
        ({0: 1, 1: 1, 2: 1}, r"kernel 'copy': argument 1 has no \[\[buffer\(1\)\]\] parameter"),
        ({0: 1, 2: 0}, r"kernel 'copy': argument 2 is not an address"),
    ],
)
def test_missing_extra_and_null_arguments(args, pattern):
    fn = compile_library(GOOD).function("copy")
    with pytest.raises(MslError, match=pattern):
        fn.dispatch(args, threads=(4,))


@pytest.mark.parametrize(
    "threads, group, pattern",
    [
        ((64,), (2048,), "exceeds the kernel's 1024 threads"),
        ((64,), (0,), "zero dimension"),
        ((64, 1, 1, 1), None, "1 to 3 dimensions"),
        ((-1,), None, "non-negative"),
    ],
)
def test_bad_grid_shapes(threads, group, pattern):
    fn = compile_library(GOOD).function("copy")
    x = torch.zeros(64)
    with pytest.raises(MslError, match=pattern):
        fn.dispatch({0: x.data_ptr(), 2: x.data_ptr()}, threads=threads, group=group)


def test_unknown_construct_names_the_construct_and_the_kernel():
    src = (
        GOOD
        + """
kernel void twirl(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = metal::frobnicate(out[i]);
}
"""
    )
    with pytest.raises(MslError) as e:
        compile_library(src)
    assert e.value.kernel == "twirl"
    assert e.value.construct == "metal::frobnicate"
    assert "twirl" in str(e.value) and "frobnicate" in str(e.value)


def test_unknown_construct_inside_a_helper_template_names_the_calling_kernel():
    src = """
#include <metal_stdlib>
template <typename T> T helper(T x) { return wobble(x); }  // looked up when instantiated
kernel void first(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = 1.0f;
}
kernel void second(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = helper(out[i]);
}
"""
    with pytest.raises(MslError) as e:
        compile_library(src)
    assert e.value.kernel == "second"
    assert "wobble" in e.value.construct


def test_unsupported_parameter_attribute():
    src = """
#include <metal_stdlib>
kernel void tex(device float* out [[buffer(0)]], texture2d<float> t [[texture(0)]],
                uint i [[thread_position_in_grid]]) {
  out[i] = 0;
}
"""
    with pytest.raises(
        MslError, match=r"kernel 'tex': unsupported kernel parameter \[\[texture\(0\)\]\]"
    ):
        compile_library(src)


def test_source_must_be_text():
    with pytest.raises(MslError, match="must be text"):
        compile_library(b"kernel void f() {}")  # type: ignore[arg-type]


DEADLOCK = """
#include <metal_stdlib>
using namespace metal;
kernel void early_exit(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]],
                       uint gid [[thread_position_in_grid]]) {
  if (lid < 10) return;  // these threads never reach the barrier
  threadgroup float tmp[64];
  tmp[lid] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = tmp[63 - lid];
}
kernel void divergent(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]],
                      uint gid [[thread_position_in_grid]]) {
  float v = float(gid);
  out[gid] = lane < 16 ? simd_sum(v) : simd_max(v);
}
"""


def test_barrier_deadlock_is_an_error_and_the_executor_recovers():
    lib = compile_library(DEADLOCK)
    out = torch.zeros(128)
    with pytest.raises(
        MslError,
        match=r"kernel 'early_exit': threadgroup \(0, 0, 0\): deadlock: 54 of 64 threads wait at threadgroup_barrier and 10 returned",
    ):
        lib.function("early_exit").dispatch({0: out.data_ptr()}, threads=(128,), group=(64,))
    # the next dispatch on this thread runs normally
    fn = compile_library(GOOD).function("copy")
    x = torch.arange(100, dtype=torch.float32)
    y = torch.zeros(100)
    fn.dispatch({0: y.data_ptr(), 2: x.data_ptr()}, threads=(100,), group=(32,))
    assert torch.equal(x, y)


def test_divergent_simd_operations_are_an_error_not_a_wrong_answer():
    lib = compile_library(DEADLOCK)
    out = torch.zeros(64)
    with pytest.raises(MslError, match="kernel 'divergent'.*divergent SIMD-group operations"):
        lib.function("divergent").dispatch({0: out.data_ptr()}, threads=(64,), group=(64,))


def test_threadgroup_larger_than_the_kernels_declared_maximum():
    src = """
#include <metal_stdlib>
[[max_total_threads_per_threadgroup(64)]]
kernel void small_groups(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = 2.0f;
}
"""
    fn = compile_library(src).function("small_groups")
    assert fn.max_threads_per_group == 64
    out = torch.zeros(128)
    with pytest.raises(
        MslError,
        match=r"kernel 'small_groups': threadgroup size \(128, 1, 1\) exceeds the kernel's 64 threads",
    ):
        fn.dispatch({0: out.data_ptr()}, threads=(128,), group=(128,))
    fn.dispatch({0: out.data_ptr()}, threads=(128,), group=(64,))
    assert torch.equal(out, torch.full((128,), 2.0))
