"""Process-wide shim state: the handle table, live storages, the last error, modes.

An ``AtenTensorHandle`` the ``.so`` sees is an opaque non-zero integer that keys
``HANDLES``; the table holds the only strong reference to each shim ``Tensor``.
Every storage with at least one tensor is in ``LIVE_STORAGES``; when a storage's
count drops to zero it is released (owned memory freed, borrowed left alone).
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections import deque
from dataclasses import dataclass

from . import native_tensors
from .dtypes import DEVICE_CPU, ITEMSIZE
from .storage import HOST_ALLOCATOR, POLICY_HOOKS, ShimError, Storage, Tensor

# handles look like aligned pointers; never 0 (NULL)
_HANDLE_BASE = 0x7E70_0000_0000
_next_handle = itertools.count(1).__next__

HANDLES: dict[int, Tensor] = {}
LIVE_STORAGES: dict[int, Storage] = {}  # id(storage) -> storage

# one model runs at a time; ctypes callbacks hold the GIL, this orders whole runs
RUN_LOCK = threading.RLock()

MATERIALIZE_MODES = ("view", "seed")


class _Flags:
    grad_enabled = False
    # "view": _reinterpret_tensor keeps views in the parent's storage (correct);
    # "seed": copy non-packed views into a new buffer (upstream Metal's behaviour)
    materialize = "view"
    last_error = ""
    errors = 0
    # a failed shim whose caller ignores return codes (the Metal wrapper's mps calls):
    # the run that made it must fail with this message (AotiModel checks it)
    unchecked_error = ""


FLAGS = _Flags()


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


def memory_stats() -> MemoryStats:
    """Python's tensors and storages plus the native ones (one storage per native tensor)."""
    owned = [s for s in LIVE_STORAGES.values() if s.owned]
    native = NATIVE
    n_live = native.counter("live") if native else 0
    n_borrowed = native.counter("borrowed") if native else 0
    return MemoryStats(
        tensors=len(HANDLES) + n_live,
        storages=len(LIVE_STORAGES) + n_live,
        bytes=sum(s.nbytes for s in owned) + (native.counter("bytes") if native else 0),
        borrowed_storages=len(LIVE_STORAGES) - len(owned) + n_borrowed,
        cached_bytes=HOST_ALLOCATOR.cached_bytes + (native.counter("cached") if native else 0),
    )


def last_error() -> str:
    """The message of the most recent failed shim call ("" if none failed yet)."""
    return FLAGS.last_error


def clear_last_error() -> None:
    FLAGS.last_error = ""


def record_error(shim: str, message: str) -> None:
    FLAGS.last_error = f"{shim}: {message}"
    FLAGS.errors += 1


class Records:
    """The bridge's C-side per-handle records: a handle is the address of its record.

    The record holds what the hot read-only getters return (data pointer, dim, sizes,
    strides, dtype, device, offset, numel), so the trampoline answers them without
    calling Python. Written once when a handle is created (tensors never change shape
    in place), marked dead when it is deleted. Layout: see ``bridge._RECORD_C``.
    """

    MAX_DIMS = native_tensors.MAX_DIMS
    SIZE = native_tensors.RECORD_SIZE

    def __init__(self, base: int, memory: memoryview, count: int, total: int) -> None:
        """``count`` slots from ``base`` are Python's; the table has ``total`` (the rest are
        native tensors', see ``native_tensors``)."""
        self.base, self.memory = base, memory
        self.python_end = base + count * self.SIZE
        self.end = base + total * self.SIZE
        # FIFO reuse: a stale handle (double delete, use after delete) stays dead for as
        # long as possible, so it is reported instead of aliasing a new tensor
        self.free = deque(range(count))
        self._packers = [
            struct.Struct(f"=5q2i{d}q{8 * (8 - d)}x{d}q").pack_into
            for d in range(self.MAX_DIMS + 1)
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

    def delete(self, handle: int) -> None:
        if handle >= self.python_end:  # an adopted native tensor: its slot is C's
            NATIVE.release_slot(handle)
            return
        off = handle - self.base
        self._dead(self.memory, off, 0)
        self.free.append(off // self.SIZE)


RECORDS: Records | None = None  # set when the bridge is loaded
NATIVE: native_tensors.NativeTensors | None = None  # likewise


def sync_native_policy() -> None:
    """Serve allocations natively only while host memory is plain: a poisoning fill byte or
    a replaced host allocator must see every allocation."""
    from .core import ALLOCATORS  # core registers shims that use this module

    native = NATIVE
    if native is None:
        return
    plain = HOST_ALLOCATOR.fill_byte is None and ALLOCATORS.get(DEVICE_CPU) is HOST_ALLOCATOR
    native.set_limit(native_tensors.NATIVE_LIMIT if plain else 0)


POLICY_HOOKS.append(sync_native_policy)


def _adopt_native(handle: int) -> Tensor | None:
    """Turn a live native tensor into Python's (see ``native_tensors``); None if not one."""
    native = NATIVE
    rec = native.read(handle) if native is not None else None
    if rec is None:
        return None
    if rec.kind == native_tensors.OWNED:
        storage = Storage.native(rec.data_ptr, rec.storage_bytes, native.free_memory)
    else:  # a run's input: borrow the caller's whole storage
        base = rec.data_ptr - rec.offset * ITEMSIZE[rec.dtype]
        storage = Storage(base, rec.storage_bytes, owned=False)
    tensor = Tensor(storage, rec.dtype, rec.sizes, rec.strides, rec.offset)
    native.disown(handle)
    LIVE_STORAGES[id(storage)] = storage
    storage.count = 1
    HANDLES[handle] = tensor
    return tensor


def is_live(handle: int | None) -> bool:
    """True when ``handle`` names a live tensor, Python's or native."""
    if not handle:
        return False
    if handle in HANDLES:
        return True
    return NATIVE is not None and NATIVE.read(handle) is not None


def register(tensor: Tensor) -> int:
    """Give ``tensor`` a new handle and count it on its storage."""
    records = RECORDS
    # the handle first: if making its record fails, nothing has been counted yet
    handle = records.new(tensor) if records is not None else 0
    if not handle:
        handle = _HANDLE_BASE + (_next_handle() << 4)
        while records is not None and records.contains(handle):  # never alias a record
            handle = _HANDLE_BASE + (_next_handle() << 4)
    storage = tensor.storage
    if storage.count == 0:
        LIVE_STORAGES[id(storage)] = storage
    storage.count += 1
    HANDLES[handle] = tensor
    return handle


def lookup(handle: int | None, what: str = "tensor") -> Tensor:
    if not handle:
        raise ShimError(f"{what} handle is NULL")
    tensor = HANDLES.get(handle)
    if tensor is None:
        tensor = _adopt_native(handle)
        if tensor is None:
            raise ShimError(
                f"{what} handle {handle:#x} is not a live tensor (deleted or never created)"
            )
    return tensor


def unregister(handle: int | None) -> None:
    """Delete a handle; free its storage when it was the last tensor on it."""
    if not handle:
        raise ShimError("tensor handle is NULL")
    tensor = HANDLES.pop(handle, None)
    if tensor is None and NATIVE is not None and NATIVE.delete(handle):
        return
    if tensor is None:
        raise ShimError(
            f"tensor handle {handle:#x} is not a live tensor (double delete or never created)"
        )
    records = RECORDS
    if records is not None and records.base <= handle < records.end:
        records.delete(handle)
    storage = tensor.storage
    storage.count -= 1
    if storage.count == 0:
        del LIVE_STORAGES[id(storage)]
        storage.release()


def set_materialize(mode: str) -> str:
    """Set how ``_reinterpret_tensor`` treats non-packed views; returns the previous mode."""
    if mode not in MATERIALIZE_MODES:
        raise ValueError(f"materialize must be one of {MATERIALIZE_MODES}, got {mode!r}")
    previous, FLAGS.materialize = FLAGS.materialize, mode
    return previous
