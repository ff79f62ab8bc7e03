"""The emulated Metal device's memory: ``mps`` storage and the raw buffers of ``shim_mps.h``.

On Apple silicon a shared-storage ``MTLBuffer`` is ordinary memory the CPU and GPU both
address, so the emulation keeps it in host memory: an ``mps`` storage is a host
allocation whose tensors report c10's device type 13 (``DeviceType::MPS``). Two kinds of
memory exist, as on a Mac:

- tensors from ``aoti_torch_empty_strided(..., device_type=mps)``: storages made by
  ``MPS_ALLOCATOR`` (registered for device 13 by ``register_mps_device``), counted like
  host ones in ``state.LIVE_STORAGES``;
- raw buffers from ``aoti_torch_mps_malloc`` (the model's constants blob): kept here by
  address until ``aoti_torch_mps_free``. ``aoti_torch_mps_memcpy`` / ``copy_buffer`` fill
  them; both check that the bytes they write lie inside one such buffer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from .. import state
from ..core import register_allocator
from ..dtypes import DEVICE_CODES
from ..registry import put_ptr, shim
from ..storage import HostAllocator, ShimError

DEVICE_MPS = DEVICE_CODES["mps"]  # c10::DeviceType::MPS


class MpsAllocator(HostAllocator):
    """Host memory standing for shared-storage ``MTLBuffer``s (page-aligned, like Metal's).

    No free-buffer cache: every storage released is given back at once, so live ``mps``
    memory is exactly what the model holds.
    """

    device_type = DEVICE_MPS
    alignment = 64

    def __init__(self) -> None:
        super().__init__(cache_limit_bytes=0)


MPS_ALLOCATOR = MpsAllocator()


@dataclass
class RawBuffer:
    """One ``aoti_torch_mps_malloc`` allocation (the tensor keeps the memory)."""

    ptr: int
    nbytes: int
    memory: torch.Tensor


# contents pointer -> buffer, as upstream's ptr_to_mtl_buffer
BUFFERS: dict[int, RawBuffer] = {}


def register_mps_device() -> None:
    """Make ``empty_strided`` on device 13 allocate emulated Metal buffers (idempotent)."""
    register_allocator(MPS_ALLOCATOR)


def live_mps_storages() -> int:
    """Live ``mps`` memory objects: storages with tensors on them plus ``mps_malloc`` buffers."""
    tensors = sum(1 for s in state.LIVE_STORAGES.values() if s.device_type == DEVICE_MPS)
    return tensors + len(BUFFERS)


def live_mps_bytes() -> int:
    owned = sum(
        s.nbytes for s in state.LIVE_STORAGES.values() if s.device_type == DEVICE_MPS and s.owned
    )
    return owned + sum(b.nbytes for b in BUFFERS.values())


def _buffer_span(ptr: int, nbytes: int, what: str) -> RawBuffer:
    """The malloc'd buffer holding ``[ptr, ptr + nbytes)``; an error naming ``what`` if none."""
    for buf in BUFFERS.values():
        if buf.ptr <= ptr and ptr + nbytes <= buf.ptr + buf.nbytes:
            return buf
    raise ShimError(
        f"{what}: bytes [{ptr:#x}, +{nbytes}) are not inside a buffer from "
        "aoti_torch_mps_malloc (unknown or freed buffer, or the copy overruns it)"
    )


def _check_size(value: int, what: str) -> int:
    if value < 0 or value > (1 << 48):
        raise ShimError(f"{what} {value} is not a valid byte count")
    return value


@shim
def aoti_torch_mps_malloc(buffer, num_bytes):
    if not buffer:
        raise ShimError("output pointer buffer is NULL")
    _check_size(num_bytes, "num_bytes")
    if num_bytes == 0:  # as upstream: no buffer, a NULL contents pointer
        put_ptr(buffer, 0, "buffer")
        return
    memory = MPS_ALLOCATOR.allocate(num_bytes)
    ptr = memory.data_ptr()
    BUFFERS[ptr] = RawBuffer(ptr, num_bytes, memory)
    put_ptr(buffer, ptr, "buffer")


@shim
def aoti_torch_mps_free(ptr):
    if not ptr:
        return  # freeing NULL is a no-op, as upstream
    if BUFFERS.pop(ptr, None) is None:
        raise ShimError(
            f"pointer {ptr:#x} is not a live buffer from aoti_torch_mps_malloc "
            "(double free or foreign memory)"
        )


@shim
def aoti_torch_mps_memcpy(buffer, constant_offset, bytes_read, data_size, constants_start):
    """Copy constant bytes ``constants_start[bytes_read:+data_size]`` to ``buffer+constant_offset``."""
    if not buffer or not constants_start:
        raise ShimError("buffer or constants_start is NULL")
    for value, what in ((constant_offset, "constant_offset"), (bytes_read, "bytes_read")):
        _check_size(value, what)
    _check_size(data_size, "data_size")
    if data_size == 0:
        return
    dst = buffer + constant_offset
    _buffer_span(dst, data_size, "aoti_torch_mps_memcpy destination")
    ctypes.memmove(dst, constants_start + bytes_read, data_size)


@shim
def aoti_torch_mps_copy_buffer(src_buffer, dst_buffer, data_size, src_offset, dst_offset):
    if not src_buffer or not dst_buffer:
        raise ShimError("src_buffer or dst_buffer is NULL")
    for value, what in (
        (data_size, "data_size"),
        (src_offset, "src_offset"),
        (dst_offset, "dst_offset"),
    ):
        _check_size(value, what)
    if data_size == 0:
        return
    dst = dst_buffer + dst_offset
    _buffer_span(dst, data_size, "aoti_torch_mps_copy_buffer destination")
    ctypes.memmove(dst, src_buffer + src_offset, data_size)
