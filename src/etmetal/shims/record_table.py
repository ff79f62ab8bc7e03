"""The bridge's per-handle records (Python's half of the table) and the memory statistics.

A ``ShimContext`` owns one ``Records`` once its bridge is loaded; nothing here is
process-wide.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from . import native_tensors
from .storage import Tensor

_HEAD = "=5q2i"  # etm_rec's live..device_type, then sizes; tied to native_tensors.Record:
_REC = native_tensors.Record
assert struct.calcsize(_HEAD) == _REC.sizes.offset
assert _REC.strides.offset == _REC.sizes.offset + _REC.sizes.size


def _record_prefix(d: int) -> str:
    """The ``struct`` format writing a ``d``-dim tensor's record up to its last stride: the
    unused sizes are skipped, the unused strides and what follows are left alone."""
    unused = _REC.sizes.size // native_tensors.MAX_DIMS * (native_tensors.MAX_DIMS - d)
    return f"{_HEAD}{d}q{unused}x{d}q"


@dataclass(frozen=True)
class MemoryStats:
    tensors: int  # live handles
    storages: int  # live storages, owned or borrowed
    bytes: int  # bytes held by live owned storages
    borrowed_storages: int
    cached_bytes: int  # freed host buffers kept for reuse (HOST_ALLOCATOR.empty_cache())

    def live(self) -> tuple[int, int, int]:
        """(tensors, storages, bytes): what must come back to its value when work is undone."""
        return self.tensors, self.storages, self.bytes


class Records:
    """The bridge's C-side per-handle records: a handle is the address of its record.

    The record holds what the hot read-only getters return (data pointer, dim, sizes,
    strides, dtype, device, offset, numel), so the trampoline answers them without
    calling Python. Written once when a handle is created (tensors never change shape
    in place), marked dead when it is deleted. Layout: ``etm_rec`` in ``native_tensors.h``.
    """

    MAX_DIMS = native_tensors.MAX_DIMS
    SIZE = native_tensors.RECORD_SIZE

    def __init__(
        self,
        base: int,
        memory: memoryview,
        count: int,
        total: int,
        native: native_tensors.NativeTensors,
    ) -> None:
        """``count`` slots from ``base`` are Python's; the table has ``total`` (the rest are
        native tensors', managed by ``native``)."""
        self.base, self.memory, self.native = base, memory, native
        self.python_end = base + count * self.SIZE
        self.end = base + total * self.SIZE
        # FIFO reuse: a stale handle (double delete, use after delete) stays dead for as
        # long as possible, so it is reported instead of aliasing a new tensor
        self.free = deque(range(count))
        self._packers = [
            struct.Struct(_record_prefix(d)).pack_into for d in range(self.MAX_DIMS + 1)
        ]
        self._dead = struct.Struct("=q").pack_into

    def contains(self, handle: int) -> bool:
        return self.base <= handle < self.end

    def new(self, t: Tensor) -> int:
        """A record for ``t``; 0 when none is free or ``t`` has too many dims."""
        d = len(t.sizes)
        if d > self.MAX_DIMS or not self.free:
            return 0
        slot = self.free.popleft()
        off = slot * self.SIZE
        numel = 1
        for n in t.sizes:
            numel *= n
        self._packers[d](
            self.memory,
            off,
            1,
            t.data_ptr,
            d,
            t.offset,
            numel,
            t.dtype,
            t.storage.device_type,
            *t.sizes,
            *t.strides,
        )
        return self.base + off

    def rewrite(self, handle: int, t: Tensor) -> bool:
        """Point the record at ``handle`` to ``t`` (the proxy executor fills an output handle
        in place); False when ``t`` has more dims than a record holds."""
        d = len(t.sizes)
        if d > self.MAX_DIMS:
            return False
        numel = 1
        for n in t.sizes:
            numel *= n
        self._packers[d](
            self.memory,
            handle - self.base,
            1,
            t.data_ptr,
            d,
            t.offset,
            numel,
            t.dtype,
            t.storage.device_type,
            *t.sizes,
            *t.strides,
        )
        return True

    def delete(self, handle: int) -> None:
        if handle >= self.python_end:  # an adopted native tensor: its slot is C's
            self.native.release_slot(handle)
            return
        off = handle - self.base
        self._dead(self.memory, off, 0)
        self.free.append(off // self.SIZE)
