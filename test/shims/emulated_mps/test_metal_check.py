"""The Metal checker on hand-written kernels: each planted fault is reported with its kernel,
thread position, memory and byte offset; correct kernels report nothing; an unchecked build
runs no checking code.

Where a fault is expected is worked out from the kernel's text and the launch (which thread
first touches which byte), not read from the checker. Expected results of the clean kernels
come from torch.
"""

from __future__ import annotations

import ctypes
import subprocess

import pytest
import torch

from etmetal.shims.emulated_mps import compile_library
from etmetal.shims.emulated_mps.check import parse_mode
from etmetal.shims.emulated_mps.msl import MslError, checked_accesses

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"

OOB_READ = (
    HEADER
    + """
kernel void shift_left(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                       uint i [[thread_position_in_grid]]) {
  out[i] = in[i + 1];  // the last thread reads one past the end
}
"""
)

OOB_WRITE = (
    HEADER
    + """
kernel void shift_right(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
  out[i + 1] = in[i];  // the last thread writes one past the end
}
"""
)

UNINIT = (
    HEADER
    + """
kernel void half_filled(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                        uint gid [[thread_position_in_grid]],
                        uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[64];
  if (lid != 40) tile[lid] = in[gid];  // thread 40 forgets its element
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = tile[lid];
}
"""
)

NO_BARRIER = (
    HEADER
    + """
kernel void neighbour(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                      uint gid [[thread_position_in_grid]],
                      uint lid [[thread_position_in_threadgroup]],
                      uint n [[threads_per_threadgroup]]) {
  threadgroup float tile[64];
  tile[lid] = in[gid];
  // missing: threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = tile[(lid + 1) % n];
}
"""
)

SAME_SLOT = (
    HEADER
    + """
kernel void last_wins(device float* out [[buffer(0)]],
                      uint gid [[thread_position_in_grid]],
                      uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float slot[1];
  slot[0] = float(lid);  // every thread writes the same address
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = slot[0];
}
"""
)

ADD_ONE = (
    HEADER
    + """
kernel void add_one(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                    uint i [[thread_position_in_grid]]) {
  out[i] = in[i] + 1.0f;
}
"""
)

TREE_SUM = (
    HEADER
    + """
kernel void tree_sum(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                     uint gid [[thread_position_in_grid]],
                     uint lid [[thread_position_in_threadgroup]],
                     uint tg [[threadgroup_position_in_grid]]) {
  threadgroup float part[128];
  part[lid] = in[gid];
  for (uint stride = 64; stride > 0; stride /= 2) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lid < stride) part[lid] += part[lid + stride];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid == 0) out[tg] = part[0];
}
"""
)


def addr(t: torch.Tensor) -> int:
    return t.data_ptr()


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def checked(source: str, name: str):
    return compile_library(source, checked=True).function(name)


def test_out_of_bounds_read_names_kernel_thread_buffer_and_offset():
    n = 100
    x, out = torch.randn(n), torch.zeros(n)
    fn = checked(OOB_READ, "shift_left")
    [fault] = fn.check(
        {0: addr(out), 1: addr(x)}, (n,), (32,), extents={0: nbytes(out), 1: nbytes(x)}
    )
    # thread 99 = threadgroup 3, thread 3 (groups of 32) reads in[100]: 400 bytes in
    assert (fault.kernel, fault.kind, fault.check) == (
        "shift_left",
        "out-of-bounds read",
        "memcheck",
    )
    assert (fault.threadgroup, fault.thread) == ((3, 0, 0), (3, 0, 0))
    assert (fault.buffer, fault.offset, fault.size, fault.extent) == (1, 400, 4, 400)
    assert fault.site == "library.metal:6: in[i + 1]"  # line 6 of the source
    # the redirected read gives 0, the other threads read what they should
    torch.testing.assert_close(out[:-1], x[1:])
    assert "kernel 'shift_left'" in str(fault) and "buffer(1) byte offset 400" in str(fault)


def test_out_of_bounds_write_is_reported_and_goes_nowhere():
    n = 100
    x = torch.randn(n)
    backing = torch.full((n + 8,), -7.0)  # the binding covers the first n floats only
    fn = checked(OOB_WRITE, "shift_right")
    [fault] = fn.check(
        {0: addr(backing), 1: addr(x)}, (n,), (32,), extents={0: 4 * n, 1: nbytes(x)}
    )
    assert (fault.kind, fault.buffer, fault.offset) == ("out-of-bounds write", 0, 400)
    assert (fault.threadgroup, fault.thread) == ((3, 0, 0), (3, 0, 0))
    torch.testing.assert_close(backing[1:n], x[: n - 1])
    assert torch.equal(backing[n:], torch.full((8,), -7.0))  # the stray store never landed


def test_uninitialized_threadgroup_read():
    n = 128
    x, out = torch.randn(n), torch.zeros(n)
    fn = checked(UNINIT, "half_filled")
    faults = fn.check(
        {0: addr(out), 1: addr(x)}, (n,), (64,), extents={0: nbytes(out), 1: nbytes(x)}
    )
    [fault] = faults
    # thread 40 of each threadgroup reads the element nobody wrote, 160 bytes in
    assert fault.kind == "uninitialized threadgroup read" and fault.check == "memcheck"
    assert (fault.threadgroup, fault.thread) == ((0, 0, 0), (40, 0, 0))
    assert (fault.memory, fault.buffer, fault.offset, fault.extent) == (
        "threadgroup array 'tile'",
        None,
        160,
        256,
    )
    assert fault.count == 2  # once per threadgroup
    # the checker poisons threadgroup memory (all-ones bytes: NaN) when a threadgroup starts
    assert out[[40, 104]].isnan().all()
    keep = torch.ones(n, dtype=torch.bool)
    keep[[40, 104]] = False
    torch.testing.assert_close(out[keep], x[keep])


def test_missing_barrier_is_a_race_between_named_threads():
    n = 64
    x, out = torch.randn(n), torch.zeros(n)
    fn = checked(NO_BARRIER, "neighbour")
    args, ext = {0: addr(out), 1: addr(x)}, {0: nbytes(out), 1: nbytes(x)}
    races = fn.check(args, (n,), (n,), extents=ext, checks=("racecheck",))
    by_kind = {f.kind: f for f in races}
    assert all(f.check == "racecheck" for f in races)
    # thread 0 reads tile[1] before thread 1 writes it: thread 1's write follows a read
    war = by_kind["threadgroup race (write after another thread's read)"]
    assert (war.thread, war.other_thread, war.offset) == ((1, 0, 0), (0, 0, 0), 4)
    # thread 63 reads tile[0], which thread 0 wrote with no barrier between
    raw = by_kind["threadgroup race (read after another thread's write)"]
    assert (raw.thread, raw.other_thread, raw.offset) == ((63, 0, 0), (0, 0, 0), 0)
    assert set(by_kind) == {war.kind, raw.kind}
    # memcheck alone sees the reads of elements not written yet
    [uninit] = fn.check(args, (n,), (n,), extents=ext, checks=("memcheck",))
    assert (uninit.kind, uninit.thread, uninit.offset) == (
        "uninitialized threadgroup read",
        (0, 0, 0),
        4,
    )


def test_two_threads_writing_one_address_is_a_race():
    n = 40
    out = torch.zeros(n)
    fn = checked(SAME_SLOT, "last_wins")
    [fault] = fn.check({0: addr(out)}, (n,), (n,), extents={0: nbytes(out)})
    assert fault.kind == "threadgroup race (write after another thread's write)"
    assert (fault.thread, fault.other_thread, fault.offset) == ((1, 0, 0), (0, 0, 0), 0)
    assert fault.count == n - 1


def test_overlapping_bindings_of_different_ranges_are_aliasing():
    n = 64
    buf = torch.arange(n + 1, dtype=torch.float32)
    fn = checked(ADD_ONE, "add_one")
    # out = buf[1:], in = buf[:-1]: the offset view of #22956
    out_ptr, in_ptr = addr(buf) + 4, addr(buf)
    [fault] = fn.check({0: out_ptr, 1: in_ptr}, (n,), (32,), extents={0: 4 * n, 1: 4 * n})
    assert (fault.kind, fault.check) == ("aliased bindings", "racecheck")
    assert (fault.buffer, fault.other_buffer) == (0, 1)
    assert (fault.offset, fault.size, fault.extent) == (0, 4 * (n - 1), 4 * n)
    assert (fault.threadgroup, fault.thread) == ((0, 0, 0), (0, 0, 0))  # its first write


def test_in_place_binding_of_the_same_range_twice_is_clean():
    n = 100
    buf = torch.randn(n)
    expected = buf + 1
    fn = checked(ADD_ONE, "add_one")
    faults = fn.check(
        {0: addr(buf), 1: addr(buf)}, (n,), (32,), extents={0: nbytes(buf), 1: nbytes(buf)}
    )
    assert faults == []
    torch.testing.assert_close(buf, expected)


def test_barrier_synchronized_reduction_is_clean_and_correct():
    groups = 5
    x = torch.randn(groups * 128)
    out = torch.zeros(groups)
    fn = checked(TREE_SUM, "tree_sum")
    faults = fn.check(
        {0: addr(out), 1: addr(x)}, (groups * 128,), (128,), extents={0: 4 * groups, 1: nbytes(x)}
    )
    assert faults == []
    torch.testing.assert_close(out, x.view(groups, 128).sum(1), rtol=1e-5, atol=1e-5)
    accesses, dropped = fn.last_check
    assert dropped == 0 and accesses > groups * 128 * 2  # every subscript went through it


def _undefined(path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True
    )
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def test_an_unchecked_build_runs_no_checking_code():
    plain, instrumented = compile_library(TREE_SUM), compile_library(TREE_SUM, checked=True)
    assert plain.path != instrumented.path  # two builds, two cache entries
    assert not {s for s in _undefined(plain.path) if s.startswith("etm_msl_check")}
    assert {"etm_msl_check_threadgroup", "etm_msl_check_device"} <= _undefined(instrumented.path)
    x, out = torch.randn(256), torch.zeros(2)
    before = checked_accesses()
    plain.function("tree_sum").dispatch({0: addr(out), 1: addr(x)}, (256,), (128,))
    assert checked_accesses() == before
    instrumented.function("tree_sum").check(
        {0: addr(out), 1: addr(x)}, (256,), (128,), extents={0: 8, 1: nbytes(x)}
    )
    assert checked_accesses() > before


def test_check_needs_the_checked_build_and_every_extent():
    with pytest.raises(MslError, match="checked build"):
        compile_library(ADD_ONE).function("add_one").check({0: 1, 1: 1}, (1,), extents={})
    x = torch.zeros(4)
    with pytest.raises(MslError, match=r"extent of \[\[buffer\(1\)\]\]"):
        checked(ADD_ONE, "add_one").check({0: addr(x), 1: addr(x)}, (4,), extents={0: 16})


def test_check_mode_words():
    assert parse_mode("memcheck,racecheck").checks == {"memcheck", "racecheck"}
    assert parse_mode("all,report").collect
    assert parse_mode("") is None and parse_mode("off") is None
    with pytest.raises(ValueError, match="unknown check 'memchek'"):
        parse_mode("memchek")


def test_a_scalar_slot_is_bounded_by_its_size():
    # a by-reference scalar's extent is the parameter's own size; nothing to give
    src = HEADER + (
        "kernel void fill(device float* out [[buffer(0)]], constant float& v [[buffer(1)]],"
        " uint i [[thread_position_in_grid]]) { out[i] = v; }\n"
    )
    out, v = torch.zeros(8), ctypes.c_float(2.5)
    fn = checked(src, "fill")
    assert fn.check({0: addr(out), 1: ctypes.addressof(v)}, (8,), extents={0: 32}) == []
    assert torch.equal(out, torch.full((8,), 2.5))


CONSTRUCTS = (
    HEADER
    + """
inline float row_sum(threadgroup float* row, uint n) {  // a helper's threadgroup pointer
  float s = 0;
  for (uint j = 0; j < n; j++) s += row[j];
  return s;
}
kernel void constructs(device float4* out [[buffer(0)]], constant float* in [[buffer(1)]],
                       constant int* perm [[buffer(2)]],
                       uint gid [[thread_position_in_grid]],
                       uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float grid2[4][8], spare[8];
  grid2[lid / 8][lid % 8] = in[perm[gid]];  // a 2-D array, a nested subscript
  threadgroup float* mine = &spare[lid % 8];  // an address taken: no access
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device float4* o = out + gid;  // a local device pointer: its binding is found by address
  o[0].x = row_sum(grid2[lid / 8], 8);  // a row passed on is a pointer, not an access
  o[0].y = float(lid);
  o[0].zw = float2(in[gid], float(mine == &spare[lid % 8]));
}
"""
)


def test_instrumented_constructs_stay_correct_and_a_local_pointer_finds_its_binding():
    n = 32
    x = torch.randn(n)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).to(torch.int32)
    out = torch.zeros(n, 4)
    fn = checked(CONSTRUCTS, "constructs")
    args = {0: addr(out), 1: addr(x), 2: addr(perm)}
    ext = {0: nbytes(out), 1: nbytes(x), 2: nbytes(perm)}
    assert fn.check(args, (n,), (n,), extents=ext) == []
    rows = x[perm.long()].view(4, 8).sum(1)
    torch.testing.assert_close(out[:, 0], rows.repeat_interleave(8))
    assert torch.equal(out[:, 1], torch.arange(n, dtype=torch.float32))
    torch.testing.assert_close(out[:, 2], x)
    assert torch.equal(out[:, 3], torch.ones(n))  # each thread's `mine` is its own pointer
    plain = torch.zeros(n, 4)
    compile_library(CONSTRUCTS).function("constructs").dispatch(
        {**args, 0: addr(plain)}, (n,), (n,)
    )
    assert torch.equal(plain, out)  # the normal build computes the same
    # the output binding one float4 short: the last thread's store through `o` is outside it
    short = {**ext, 0: nbytes(out) - 16}
    faults = fn.check(args, (n,), (n,), extents=short)
    assert {(f.kind, f.buffer, f.offset, f.thread) for f in faults} == {
        ("out-of-bounds write", 0, 16 * (n - 1), (n - 1, 0, 0))
    }


REUSED_SCRATCH = """
#include <c10/metal/reduction_utils.h>
using namespace metal;
kernel void two_sums(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                     uint gid [[thread_position_in_grid]],
                     uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float scratch[32];
  float a = c10::metal::threadgroup_sum(scratch, in[gid], lid, 64u);
  BARRIER
  float b = c10::metal::threadgroup_sum(scratch, in[gid] * 2.0f, lid, 64u);
  out[gid] = a + b;
}
"""


def test_reusing_a_c10_reduction_scratch_without_a_barrier_is_a_race_inside_c10():
    # the first sum's result is read from scratch[0] by every thread; the second sum's
    # first store (thread 0, lane 0 of SIMD group 0) overwrites it with no barrier between
    x, out = torch.randn(128), torch.zeros(128)
    args, ext = {0: addr(out), 1: addr(x)}, {0: nbytes(out), 1: nbytes(x)}
    racy = checked(REUSED_SCRATCH.replace("BARRIER", ""), "two_sums")
    [fault] = racy.check(args, (128,), (64,), extents=ext)
    assert fault.kind == "threadgroup race (write after another thread's read)"
    assert (fault.threadgroup, fault.thread, fault.offset) == ((0, 0, 0), (0, 0, 0), 0)
    assert fault.memory == "threadgroup array 'scratch'" and fault.other_thread is None
    assert fault.site.startswith("c10/metal/reduction_utils.h:")  # found in c10's helper
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    fixed = checked(REUSED_SCRATCH.replace("BARRIER", barrier), "two_sums")
    assert fixed.check(args, (128,), (64,), extents=ext) == []
    torch.testing.assert_close(out, (3 * x.view(2, 64).sum(1)).repeat_interleave(64))


TG_OVERRUN = (
    HEADER
    + """
kernel void overrun(device float* out [[buffer(0)]], constant float* in [[buffer(1)]],
                    uint gid [[thread_position_in_grid]],
                    uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[lid + 1] = in[gid];  // thread 63 stores one past the array
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = lid ? tile[lid] : 0.0f;
}
"""
)


def test_a_store_past_a_threadgroup_array_is_reported_and_dropped():
    n = 64
    x, out = torch.randn(n), torch.zeros(n)
    fn = checked(TG_OVERRUN, "overrun")
    [fault] = fn.check(
        {0: addr(out), 1: addr(x)}, (n,), (n,), extents={0: nbytes(out), 1: nbytes(x)}
    )
    assert (fault.kind, fault.check) == ("out-of-bounds threadgroup write", "memcheck")
    assert (fault.thread, fault.memory, fault.offset, fault.extent) == (
        (63, 0, 0),
        "threadgroup array 'tile'",
        256,
        256,
    )
    torch.testing.assert_close(out[1:], x[:-1])


NEIGHBOURS = (
    HEADER
    + """
kernel void neighbours(device float* out [[buffer(0)]],
                       uint gid [[thread_position_in_grid]],
                       uint lid [[thread_position_in_threadgroup]]) {
  threadgroup float a[8], b[8];
  b[lid] = 1.0f;
  a[lid + 8] = 2.0f;  // past a: on a host this address may well be inside b
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[gid] = b[lid];
}
"""
)


@pytest.mark.deliberate_ub  # indexes past its array on purpose: UBSan stops first
def test_an_array_subscript_must_stay_in_its_own_array():
    out = torch.zeros(8)
    fn = checked(NEIGHBOURS, "neighbours")
    [fault] = fn.check({0: addr(out)}, (8,), (8,), extents={0: nbytes(out)})
    assert (fault.kind, fault.memory, fault.thread) == (
        "out-of-bounds threadgroup write",
        "threadgroup array 'a'",
        (0, 0, 0),
    )
    assert (fault.offset, fault.extent, fault.count) == (32, 32, 8)
    assert torch.equal(out, torch.ones(8))  # b kept what was stored in it


def test_a_threadgroup_array_too_large_to_shadow_is_an_error():
    src = HEADER + (
        "kernel void huge(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {"
        " threadgroup float big[1 << 19]; big[i] = 1.0f; out[i] = big[i]; }\n"
    )
    out = torch.zeros(4)
    with pytest.raises(MslError, match="cannot shadow a threadgroup array of 2097152 bytes"):
        checked(src, "huge").check({0: addr(out)}, (4,), extents={0: 16})
    # the executor recovers: the next checked dispatch runs
    assert (
        checked(ADD_ONE, "add_one").check(
            {0: addr(out), 1: addr(out)}, (4,), extents={0: 16, 1: 16}
        )
        == []
    )
