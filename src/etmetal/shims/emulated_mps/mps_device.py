"""The emulated Metal device's memory: ``mps`` storage and the raw buffers of ``shim_mps.h``.

On Apple silicon a shared-storage ``MTLBuffer`` is ordinary memory the CPU and GPU both
address, so the emulation keeps it in host memory: an ``mps`` storage is a host
allocation whose tensors report c10's device type 13 (``DeviceType::MPS``). Two kinds of
memory exist, as on a Mac:

- tensors from ``aoti_torch_empty_strided(..., device_type=mps)``: storages made by the
  context's ``MpsAllocator`` (registered by ``plugin.register``),
  counted like host ones in the context's live storages;
- raw buffers from ``aoti_torch_mps_malloc`` (the model's constants blob): kept by address
  in the context's ``MpsState`` until ``aoti_torch_mps_free``. ``aoti_torch_mps_memcpy`` / ``copy_buffer`` fill
  them; both check that the bytes they write lie inside one such buffer, and that the bytes
  they read lie inside memory the device knows (the loading model's weights blob, a lent
  region, a malloc'd buffer or a live tensor).

The device's check mode (``check.py``): ``MpsState.check``, from ``ETMETAL_METAL_CHECK`` when
the state is made, or :func:`set_metal_check`. In it every dispatch runs the checked build of
its kernel; faults fail the dispatch, or are kept for :func:`check_report` (``report``).
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
from dataclasses import dataclass, field

import torch

from etmetal.common.targets import METAL_DEVICE
from etmetal.shims.abi_codes import DEVICE_MPS
from etmetal.shims.emulated_mps.check import (
    CheckMode,
    MetalFault,
    mode_from_env,
    parse_mode,
)
from etmetal.shims.registry import ShimTable, put_ptr
from etmetal.shims.storage import HostAllocator, ShimError

# this module's shims: registered on a context by whoever builds it, never on import
SHIMS = ShimTable()
shim = SHIMS.shim

__all__ = ["DEVICE_MPS", "MpsAllocator", "MpsState", "check_report", "mps_state", "set_metal_check"]


class MpsAllocator(HostAllocator):
    """Host memory standing for shared-storage ``MTLBuffer``s (page-aligned, like Metal's).

    No free-buffer cache: every storage released is given back at once, so live ``mps``
    memory is exactly what the model holds.
    """

    device_type = DEVICE_MPS
    alignment = 64

    def __init__(self) -> None:
        super().__init__(cache_limit_bytes=0)


@dataclass
class RawBuffer:
    """One ``aoti_torch_mps_malloc`` allocation (the tensor keeps the memory)."""

    ptr: int
    nbytes: int
    memory: torch.Tensor


@dataclass
class Library:
    handle: int
    compiled: object  # msl.MslLibrary
    functions: dict[str, int] = field(default_factory=dict)  # kernel name -> function handle
    source: str = ""  # the MSL, for the checked build (made on a checked dispatch)


@dataclass
class Function:
    handle: int
    library: int
    name: str
    kernel: object  # msl.MslFunction
    # the buffer indices the kernel takes: a dispatch must bind exactly these (checked
    # against this set, made once, on every dispatch)
    indices: frozenset[int] = frozenset()
    encoding: bool = False
    args: dict[int, int] = field(default_factory=dict)  # buffer index -> address
    what: dict[int, str] = field(default_factory=dict)  # buffer index -> description
    slots: list = field(default_factory=list)  # int64 slots set_arg_int owns (kept alive)
    # buffer index -> (kind, bytes read) from the kernel's signature, made once when the
    # function is fetched ({}: unknown, only the index set is checked)
    kinds: dict[int, tuple[str, int]] = field(default_factory=dict)
    # buffer index -> the tensor set_arg_tensor bound: a dispatch checks its storage is
    # still alive (the handle may have been deleted since)
    tensors: dict[int, object] = field(default_factory=dict)
    checked: object = None  # the checked build's msl.MslFunction (check mode only)


@dataclass
class MpsState:
    """What one context's emulated Metal device holds besides its storages."""

    # contents pointer -> buffer, as upstream's ptr_to_mtl_buffer
    buffers: dict[int, RawBuffer] = field(default_factory=dict)
    # their contents pointers, sorted: a copy finds its buffer by bisection
    starts: list[int] = field(default_factory=list)
    # host memory a test or tool lends as a copy source (address -> bytes), beside the
    # running model's weights blob, the malloc'd buffers and live tensors
    lent: dict[int, int] = field(default_factory=dict)
    libraries: dict[int, Library] = field(default_factory=dict)
    functions: dict[int, Function] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {"dispatches": 0, "libraries_created": 0})
    # the first launch failure of the run in progress: the Metal wrapper ignores the
    # return codes of these calls, so the run checks this afterwards
    unchecked_error: str = ""
    check: CheckMode | None = None  # the checker's mode (None: off)
    check_faults: list[MetalFault] = field(default_factory=list)  # kept in `report` mode
    next_id: object = field(default_factory=lambda: itertools.count(1).__next__)
    native_launch: bool = True  # False: every launch through Python (a bench's per-kernel timing)
    native_callbacks: tuple = ()  # the C launch path's callbacks (native_launch), kept alive
    # called with (ctx, state) when the checker's mode changes: the C launch path
    # (native_launch, which builds on this module) adds its switch here
    mode_hooks: list = field(default_factory=list)


def mps_state(ctx) -> MpsState:
    """The emulated Metal device's state in ``ctx`` (made on first use)."""
    st = ctx.device_state.get(METAL_DEVICE)
    if st is None:
        try:
            mode = mode_from_env()
        except ValueError as exc:
            raise ShimError(str(exc)) from None
        st = ctx.device_state[METAL_DEVICE] = MpsState(check=mode)
        _poison(ctx, st)
    return st


POISON = 0xFF  # check mode fills new mps memory with it: NaN / -1 where nothing was written


def _poison(ctx, st: MpsState) -> None:
    """In check mode new ``mps`` memory is filled with :data:`POISON`, so what a kernel
    leaves unwritten reads as NaN, not as stale values that look right."""
    alloc = ctx.allocators.get(DEVICE_MPS)
    if alloc is None:
        return
    if st.check is not None:
        alloc.fill_byte = POISON
    elif alloc.fill_byte == POISON:
        alloc.fill_byte = None


def set_metal_check(ctx, checks: str | list[str] | CheckMode | None) -> CheckMode | None:
    """Switch the checker of ``ctx``'s emulated Metal device: ``"memcheck,racecheck"`` (or
    one, or ``"all"``; add ``"report"`` to keep faults for :func:`check_report` instead of
    failing the dispatch), ``None`` to switch it off. Returns the previous mode."""
    st = mps_state(ctx)
    try:
        mode = (
            checks if isinstance(checks, CheckMode) else parse_mode(checks or "", "set_metal_check")
        )
    except ValueError as exc:
        raise ShimError(str(exc)) from None
    previous, st.check = st.check, mode
    _poison(ctx, st)
    for hook in st.mode_hooks:  # a checked dispatch runs through Python
        hook(ctx, st)
    return previous


def check_report(ctx, clear: bool = True) -> list[MetalFault]:
    """The faults kept in ``report`` mode since the last call (cleared unless ``clear`` is
    False)."""
    st = mps_state(ctx)
    faults = list(st.check_faults)
    if clear:
        st.check_faults.clear()
    return faults


def _native_buffers(ctx) -> ctypes.CDLL | None:
    """The bridge whose C table holds the buffers ``mps_buffers.cpp`` malloc'd (or None)."""
    bridge = getattr(ctx, "bridge", None)
    return None if bridge is None else bridge.lib


def _native_count(ctx, name: str) -> int:
    lib = _native_buffers(ctx)
    return 0 if lib is None else ctypes.c_int64.in_dll(lib, name).value


def _native_holds(ctx, ptr: int, nbytes: int) -> bool:
    lib = _native_buffers(ctx)
    if lib is None:
        return False
    return bool(lib.etm_mps_buffer_holds(ctypes.c_uint64(ptr), ctypes.c_uint64(nbytes)))


def live_mps_storages(ctx) -> int:
    """Live ``mps`` memory objects: storages with tensors on them (Python's and the bridge's
    native ones) plus ``mps_malloc`` buffers (Python's and the bridge's)."""
    tensors = sum(1 for s in ctx.live_storages.values() if s.device_type == DEVICE_MPS)
    native = _native_count(ctx, "etm_native_mps_stores") + _native_count(
        ctx, "etm_native_mps_borrowed"
    )
    return (
        tensors + native + len(mps_state(ctx).buffers) + _native_count(ctx, "etm_mps_buffer_count")
    )


def live_mps_bytes(ctx) -> int:
    owned = sum(
        s.nbytes for s in ctx.live_storages.values() if s.device_type == DEVICE_MPS and s.owned
    )
    python = sum(b.nbytes for b in mps_state(ctx).buffers.values())
    native = _native_count(ctx, "etm_native_mps_bytes")
    return owned + native + python + _native_count(ctx, "etm_mps_buffer_bytes")


def plain_memory(ctx) -> bool:
    """True while ``ctx``'s mps memory may be allocated natively: the Metal checker is off
    (in check mode new memory is poisoned and every launch goes through Python), also
    when the checker's mode only waits in the environment for the device state."""
    st = ctx.device_state.get(METAL_DEVICE)
    if st is not None:
        return st.check is None
    try:
        return mode_from_env() is None
    except ValueError:
        return False  # the state's creation reports it


def take_unchecked_error(ctx) -> str:
    """The launch failure the wrapper could not see since the last call (cleared)."""
    st = mps_state(ctx)
    message, st.unchecked_error = st.unchecked_error, ""
    return message


def _buffer_span(ctx, ptr: int, nbytes: int, what: str) -> None:
    """Refuse ``[ptr, ptr + nbytes)`` unless one malloc'd buffer (Python's or the bridge's)
    holds it; the error names ``what``."""
    st = mps_state(ctx)
    # live buffers never overlap: only the one starting last at or before ptr can hold it
    i = bisect.bisect_right(st.starts, ptr) - 1
    if i >= 0:
        buf = st.buffers[st.starts[i]]
        if ptr + nbytes <= buf.ptr + buf.nbytes:
            return
    if _native_holds(ctx, ptr, nbytes):
        return
    raise ShimError(
        f"{what}: bytes [{ptr:#x}, +{nbytes}) are not inside a buffer from "
        "aoti_torch_mps_malloc (unknown or freed buffer, or the copy overruns it)"
    )


def lend_source(ctx, ptr: int, nbytes: int) -> None:
    """Allow ``[ptr, ptr + nbytes)`` as the source of ``mps_memcpy``/``copy_buffer`` (a
    caller's own constants, as a model's weights blob is while it loads)."""
    mps_state(ctx).lent[ptr] = nbytes


def withdraw_source(ctx, ptr: int) -> None:
    mps_state(ctx).lent.pop(ptr, None)


def _source_span(ctx, ptr: int, nbytes: int, what: str) -> None:
    """Refuse a copy source that is not wholly inside memory the device knows: the running
    model's weights blob, a lent region, a malloc'd buffer or a live tensor's storage."""
    end = ptr + nbytes
    span = getattr(ctx.running, "weights_span", None)
    if span is not None and span[0] <= ptr and end <= span[0] + span[1]:
        return
    st = mps_state(ctx)
    if any(start <= ptr and end <= start + n for start, n in st.lent.items()):
        return
    i = bisect.bisect_right(st.starts, ptr) - 1
    if i >= 0:
        buf = st.buffers[st.starts[i]]
        if end <= buf.ptr + buf.nbytes:
            return
    if _native_holds(ctx, ptr, nbytes):
        return
    for s in ctx.live_storages.values():
        if s.ptr <= ptr and end <= s.ptr + s.nbytes:
            return
    lib = _native_buffers(ctx)  # a live tensor of the bridge's native records
    if lib is not None and lib.etm_native_holds(ctypes.c_uint64(ptr), ctypes.c_uint64(nbytes)):
        return
    raise ShimError(
        f"{what}: bytes [{ptr:#x}, +{nbytes}) are not inside the model's weights blob, a "
        "buffer from aoti_torch_mps_malloc or a live tensor (an offset past the source?)"
    )


def _check_size(value: int, what: str) -> int:
    if value < 0 or value > (1 << 48):
        raise ShimError(f"{what} {value} is not a valid byte count")
    return value


@shim
def aoti_torch_mps_malloc(ctx, buffer, num_bytes):
    if not buffer:
        raise ShimError("output pointer buffer is NULL")
    _check_size(num_bytes, "num_bytes")
    if num_bytes == 0:  # as upstream: no buffer, a NULL contents pointer
        put_ptr(buffer, 0, "buffer")
        return
    memory = ctx.allocator(DEVICE_MPS).allocate(num_bytes)
    ptr = memory.data_ptr()
    st = mps_state(ctx)
    st.buffers[ptr] = RawBuffer(ptr, num_bytes, memory)
    bisect.insort(st.starts, ptr)
    put_ptr(buffer, ptr, "buffer")


@shim
def aoti_torch_mps_free(ctx, ptr):
    if not ptr:
        return  # freeing NULL is a no-op, as upstream
    st = mps_state(ctx)
    if st.buffers.pop(ptr, None) is None:
        raise ShimError(
            f"pointer {ptr:#x} is not a live buffer from aoti_torch_mps_malloc "
            "(double free or foreign memory)"
        )
    del st.starts[bisect.bisect_left(st.starts, ptr)]


@shim
def aoti_torch_mps_memcpy(ctx, buffer, constant_offset, bytes_read, data_size, constants_start):
    """Copy constant bytes ``constants_start[bytes_read:+data_size]`` to ``buffer+constant_offset``."""
    _checked_copy(
        ctx,
        "aoti_torch_mps_memcpy",
        (buffer, constant_offset, "buffer", "constant_offset"),
        (constants_start, bytes_read, "constants_start", "bytes_read"),
        data_size,
    )


@shim
def aoti_torch_mps_copy_buffer(ctx, src_buffer, dst_buffer, data_size, src_offset, dst_offset):
    _checked_copy(
        ctx,
        "aoti_torch_mps_copy_buffer",
        (dst_buffer, dst_offset, "dst_buffer", "dst_offset"),
        (src_buffer, src_offset, "src_buffer", "src_offset"),
        data_size,
    )


def _checked_copy(ctx, shim_name: str, dst: tuple, src: tuple, nbytes: int) -> None:
    """Copy ``nbytes`` from ``src`` to ``dst`` (each ``(base, offset, base's name, offset's
    name)``) once neither base is NULL, every size is sane, the destination lies in one
    malloc'd buffer and the source in memory the device knows; nothing is written otherwise."""
    (dst_base, dst_off, dst_name, dst_what), (src_base, src_off, src_name, src_what) = dst, src
    null = [name for base, name in ((dst_base, dst_name), (src_base, src_name)) if not base]
    if null:
        raise ShimError(f"{shim_name}: {' and '.join(null)} is NULL")
    for value, what in ((dst_off, dst_what), (src_off, src_what), (nbytes, "data_size")):
        _check_size(value, what)
    if nbytes == 0:
        return
    _buffer_span(ctx, dst_base + dst_off, nbytes, f"{shim_name} destination")
    _source_span(ctx, src_base + src_off, nbytes, f"{shim_name} source (+{src_what})")
    ctypes.memmove(dst_base + dst_off, src_base + src_off, nbytes)
