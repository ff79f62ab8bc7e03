"""The handle table of a ``ShimContext``: the opaque ``AtenTensorHandle`` integers a ``.so``
sees, the tensors they name and the storages those tensors count on.

Deleting a handle drops its storage's count; a storage with no tensors left is freed
(borrowed storage never is). A handle names a Python ``Tensor`` or a native tensor the
bridge made in C (``native_tensors``), adopted by Python the first time a shim needs it.
``HandleTable`` is a collaborator of ``ShimContext``: the context makes one and calls
it; the bridge's record table and native tensors are attached when the bridge loads.
"""

from __future__ import annotations

import itertools

from etmetal.shims.abi_codes import ITEMSIZE
from etmetal.shims.record_table import MemoryStats, Records

from . import native_tensors
from .registry import out_slot
from .storage import HostAllocator, ShimError, Storage, Tensor

# handles Python makes when no record is free look like aligned pointers; never 0 (NULL)
_HANDLE_BASE = 0x7E70_0000_0000


class HandleTable:
    """Handles -> tensors, live storages, and the memory they account for."""

    def __init__(self, host: HostAllocator) -> None:
        """``host``: the context's host allocator (its cache counts in ``memory_stats``)."""
        self.host = host
        self.handles: dict[int, Tensor] = {}
        self.live_storages: dict[int, Storage] = {}  # id(storage) -> storage
        # native allocation (data address) -> the live Storage adopted views of it share
        self.native_storages: dict[int, Storage] = {}
        # the bridge's record table and native tensors, once it is loaded
        self.records: Records | None = None
        self.native: native_tensors.NativeTensors | None = None
        self._next_handle = itertools.count(1).__next__

    def memory_stats(self) -> MemoryStats:
        """Python's tensors and storages plus the native ones: native records, the native
        allocations no Python storage holds, and one borrowed storage per borrowing record."""
        owned = [s for s in self.live_storages.values() if s.owned]
        native = self.native
        n_live = native.counter("live") if native else 0
        n_borrowed = native.counter("borrowed") if native else 0
        n_stores = native.counter("stores") if native else 0
        return MemoryStats(
            tensors=len(self.handles) + n_live,
            storages=len(self.live_storages) + n_stores + n_borrowed,
            bytes=sum(s.nbytes for s in owned) + (native.counter("bytes") if native else 0),
            borrowed_storages=len(self.live_storages) - len(owned) + n_borrowed,
            cached_bytes=self.host.cached_bytes + (native.counter("cached") if native else 0),
        )

    def _adopt_native(self, handle: int) -> Tensor | None:
        """Turn a live native tensor into Python's (see ``native_tensors``); None if not one."""
        native = self.native
        rec = native.read(handle) if native is not None else None
        if rec is None:
            return None
        base = rec.data_ptr - rec.offset * ITEMSIZE[rec.dtype]
        native.disown(handle)  # the record's reference to its allocation is Python's now
        if rec.kind != native_tensors.BORROWED:  # counted storage: C's or libtorch's
            storage = self.native_storages.get(base)
            if storage is None:  # the first view of this allocation Python adopts
                storage = Storage.native(
                    base, rec.storage_bytes, native.unref_python, rec.device_type
                )
                self.native_storages[base] = storage
            else:  # its storage holds a reference already
                native.unref_python(base)
        else:  # a run's input: borrow the caller's whole storage
            storage = Storage(base, rec.storage_bytes, owned=False, device_type=rec.device_type)
        tensor = Tensor(storage, rec.dtype, rec.sizes, rec.strides, rec.offset)
        if storage.count == 0:
            self.live_storages[id(storage)] = storage
        storage.count += 1
        self.handles[handle] = tensor
        return tensor

    def is_live(self, handle: int | None) -> bool:
        """True when ``handle`` names a live tensor, Python's or native."""
        if not handle:
            return False
        if handle in self.handles:
            return True
        return self.native is not None and self.native.read(handle) is not None

    def register(self, tensor: Tensor) -> int:
        """Give ``tensor`` a new handle and count it on its storage."""
        records = self.records
        # the handle first: if making its record fails, nothing has been counted yet
        handle = records.new(tensor) if records is not None else 0
        if not handle:
            handle = _HANDLE_BASE + (self._next_handle() << 4)
            while records is not None and records.contains(handle):  # never alias a record
                handle = _HANDLE_BASE + (self._next_handle() << 4)
        storage = tensor.storage
        if storage.count == 0:
            self.live_storages[id(storage)] = storage
        storage.count += 1
        self.handles[handle] = tensor
        return handle

    def emit(self, addr: int | None, tensor: Tensor, what: str = "ret") -> None:
        """Register ``tensor`` and store its new handle at ``addr`` (checked first)."""
        slot = out_slot(addr, what)  # before registering: a NULL slot leaves nothing to undo
        slot.value = self.register(tensor)

    def lookup(self, handle: int | None, what: str = "tensor") -> Tensor:
        if not handle:
            raise ShimError(f"{what} handle is NULL")
        tensor = self.handles.get(handle)
        if tensor is None:
            tensor = self._adopt_native(handle)
            if tensor is None:
                raise ShimError(
                    f"{what} handle {handle:#x} is not a live tensor (deleted or never created)"
                )
        return tensor

    def rebind(self, handle: int | None, tensor: Tensor, what: str = "tensor") -> None:
        """Make the live ``handle`` name ``tensor`` instead (libtorch's ``*handle = t``): the
        proxy executor fills the output handles a ``.so`` passes it this way."""
        old = self.lookup(handle, what)  # adopts a native tensor first
        records = self.records
        in_table = records is not None and records.contains(handle)
        if in_table and not records.rewrite(handle, tensor):
            raise ShimError(
                f"{what}: a {len(tensor.sizes)}-d result does not fit the record of handle "
                f"{handle:#x}"
            )
        storage = tensor.storage
        if storage.count == 0:
            self.live_storages[id(storage)] = storage
        storage.count += 1
        self.handles[handle] = tensor
        gone = old.storage
        gone.count -= 1
        if gone.count == 0:
            self._release(gone)

    def unregister(self, handle: int | None) -> None:
        """Delete a handle; free its storage when it was the last tensor on it."""
        if not handle:
            raise ShimError("tensor handle is NULL")
        tensor = self.handles.pop(handle, None)
        if tensor is None and self.native is not None and self.native.delete(handle):
            return
        if tensor is None:
            raise ShimError(
                f"tensor handle {handle:#x} is not a live tensor (double delete or never created)"
            )
        records = self.records
        if records is not None and records.base <= handle < records.end:
            records.delete(handle)
        storage = tensor.storage
        storage.count -= 1
        if storage.count == 0:
            self._release(storage)

    def _release(self, storage: Storage) -> None:
        """The last tensor on ``storage`` is gone."""
        del self.live_storages[id(storage)]
        if self.native_storages.get(storage.ptr) is storage:
            del self.native_storages[storage.ptr]
        storage.release()
