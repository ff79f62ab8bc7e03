"""The shim object model: allocators, ``Storage`` and ``Tensor``.

A ``Storage`` is one allocation (owned, freed when its last tensor goes) or a
borrowed blob (never freed), with a device and a count of the tensors that
reference it. A ``Tensor`` is storage + dtype + sizes + strides + storage offset,
with any strides: views with holes stay in their parent's storage.

The memory itself is held by a 1-D ``torch.uint8`` tensor (the storage's
``buffer``) so ATen fallbacks can view it without copying; the ``.so`` only ever
sees raw data pointers.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from etmetal.shims.abi_codes import DEVICE_CPU, DTYPE_TO_TORCH, ITEMSIZE, TORCH_TO_DTYPE

from .native_tensors import NativeBlock


class ShimError(Exception):
    """A shim call was given something invalid; reported to C as AOTI_TORCH_FAILURE."""


class Allocator(ABC):
    """Device memory for owned storages (``host`` now; an ``mps`` allocator may come later)."""

    device_type: int
    alignment: int

    @abstractmethod
    def allocate(self, nbytes: int) -> torch.Tensor:
        """A 1-D uint8 tensor of at least ``nbytes`` whose data pointer is aligned."""

    def free(self, buffer: torch.Tensor, viewed: bool = True) -> None:  # noqa: B027
        """Give ``buffer`` back; ``viewed``: ATen views of it were made (they may still live)."""


class HostAllocator(Allocator):
    """Aligned host memory, like Metal shared-storage buffers on Apple silicon.

    Freed buffers are kept in a small per-size cache (a model run allocates the
    same buffer sizes every time); ``empty_cache()`` returns them to the system.
    A buffer something else still views is never cached.
    """

    device_type = DEVICE_CPU
    alignment = 64

    def __init__(self, cache_limit_bytes: int = 256 << 20) -> None:
        self.cache_limit_bytes = cache_limit_bytes
        self.cached_bytes = 0
        self._fill_byte: int | None = None
        self._free: dict[int, list[torch.Tensor]] = {}
        # told when the fill byte changes: a context serves allocations natively only while
        # its host memory is plain (``ShimContext.sync_native_policy``)
        self.policy_listeners: list[Callable[[], None]] = []

    @property
    def fill_byte(self) -> int | None:
        """Debugging: fill every buffer handed out with this byte (0xFF: NaN for floats), so
        reads of memory nobody wrote show up instead of seeing stale values."""
        return self._fill_byte

    @fill_byte.setter
    def fill_byte(self, value: int | None) -> None:
        self._fill_byte = value
        for listener in self.policy_listeners:
            listener()

    def allocate(self, nbytes: int) -> torch.Tensor:
        buf = self._allocate(nbytes)
        if self.fill_byte is not None:
            buf.fill_(self.fill_byte)
        return buf

    def _allocate(self, nbytes: int) -> torch.Tensor:
        cached = self._free.get(nbytes)
        if cached:
            self.cached_bytes -= nbytes
            return cached.pop()
        buf = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes and buf.data_ptr() % self.alignment:
            # c10's CPU allocator aligns to 64 already; this path is a safety net
            raw = torch.empty(nbytes + self.alignment, dtype=torch.uint8)
            skip = -raw.data_ptr() % self.alignment
            buf = raw[skip : skip + nbytes]
        return buf

    def free(self, buffer: torch.Tensor, viewed: bool = True) -> None:
        nbytes = buffer.numel()
        if not nbytes or self.cached_bytes + nbytes > self.cache_limit_bytes:
            return
        # 2 = the buffer itself + the temporary storage object of this query
        if viewed and torch._C._storage_Use_Count(buffer.untyped_storage()._cdata) > 2:
            return
        self._free.setdefault(nbytes, []).append(buffer)
        self.cached_bytes += nbytes

    def empty_cache(self) -> None:
        self._free.clear()
        self.cached_bytes = 0


def _buffer_at(ptr: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over foreign memory (a borrowed blob), no copy."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=torch.uint8)


class Storage:
    """One allocation or borrowed blob, shared by the tensors that reference it."""

    __slots__ = (
        "ptr",
        "nbytes",
        "owned",
        "device_type",
        "count",
        "_buffer",
        "_allocator",
        "_typed",
        "_block",
    )

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        *,
        owned: bool,
        device_type: int = DEVICE_CPU,
        buffer: torch.Tensor | None = None,
        allocator: Allocator | None = None,
    ) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.owned = owned
        self.device_type = device_type
        self.count = 0
        self._buffer = buffer
        self._allocator = allocator
        self._typed: dict[int, torch.Tensor] = {}
        self._block = None

    @classmethod
    def allocate(cls, nbytes: int, allocator: Allocator) -> Storage:
        buf = allocator.allocate(nbytes)
        return cls(
            buf.data_ptr(),
            nbytes,
            owned=True,
            device_type=allocator.device_type,
            buffer=buf,
            allocator=allocator,
        )

    @classmethod
    def native(cls, ptr: int, nbytes: int, unref, device_type: int = DEVICE_CPU) -> Storage:
        """Hold a reference to an allocation the bridge made (``native_tensors``);
        ``unref(ptr)`` drops it once neither this storage nor any ATen view of it is left."""
        storage = cls(ptr, nbytes, owned=True, device_type=device_type)
        storage._block = NativeBlock(ptr, nbytes, unref)
        return storage

    @classmethod
    def adopt(cls, tensor: torch.Tensor, device_type: int = DEVICE_CPU) -> Storage:
        """Take over the memory of a host tensor ATen just produced (a fallback's result);
        ``device_type``: the device it stands for (host memory serves the emulated ``mps``)."""
        untyped = tensor.untyped_storage()
        buf = torch.empty(0, dtype=torch.uint8).set_(untyped)
        # no allocator: ATen's memory goes back to ATen, never into the host cache
        return cls(
            untyped.data_ptr(), untyped.nbytes(), owned=True, device_type=device_type, buffer=buf
        )

    @classmethod
    def borrow_tensor(cls, tensor: torch.Tensor) -> Storage:
        """Borrow the whole storage of a caller's host tensor (no copy, never freed)."""
        untyped = tensor.untyped_storage()
        buf = torch.empty(0, dtype=torch.uint8).set_(untyped)
        return cls(untyped.data_ptr(), untyped.nbytes(), owned=False, buffer=buf)

    @property
    def buffer(self) -> torch.Tensor:
        if self._buffer is None:
            if self._block is not None and self.nbytes:
                # the ATen buffer keeps the native block (and so the memory) alive
                self._buffer = torch.frombuffer(self._block.array(), dtype=torch.uint8)
            else:
                self._buffer = _buffer_at(self.ptr, self.nbytes)
        return self._buffer

    def typed(self, dtype: int) -> torch.Tensor:
        """The whole buffer as a 1-D tensor of ``dtype`` (cached per dtype)."""
        t = self._typed.get(dtype)
        if t is None:
            itemsize = ITEMSIZE[dtype]
            if self.ptr % itemsize:
                raise ShimError(
                    f"storage at {self.ptr:#x} is not aligned for {DTYPE_TO_TORCH[dtype]}"
                )
            buf = self.buffer
            tail = buf.numel() % itemsize
            if tail:  # a blob whose size is no multiple of the element size
                buf = buf[: buf.numel() - tail]
            t = self._typed[dtype] = buf.view(DTYPE_TO_TORCH[dtype])
        return t

    def hand_over(self) -> None:
        """The memory now belongs to someone else (an adopted output): never recycle it."""
        self._allocator = None

    def release(self) -> None:
        """Called when the last tensor goes: owned memory is returned, borrowed is left alone."""
        buffer, allocator, viewed = self._buffer, self._allocator, bool(self._typed)
        self._buffer = self._allocator = self._block = None  # a native block frees when unviewed
        self._typed = {}
        if self.owned and allocator is not None and buffer is not None:
            # a buffer only kernels touched (never viewed by ATen) cannot be referenced elsewhere
            allocator.free(buffer, viewed)


def packed_extent(sizes: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements spanned by a view (0 when it has no elements)."""
    extent = 1
    for s, st in zip(sizes, strides):
        if s == 0:
            return 0
        extent += (s - 1) * st
    return extent


def contiguous_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def is_packed(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when the view covers a dense block (some permutation of contiguous): no holes."""
    dims = sorted((st, s) for s, st in zip(sizes, strides) if s != 1)
    expected = 1
    for st, s in dims:
        if st != expected:
            return False
        expected *= s
    return True


class Tensor:
    """A view: storage + dtype + sizes + strides + storage offset (in elements)."""

    __slots__ = (
        "storage",
        "dtype",
        "sizes",
        "strides",
        "offset",
        "data_ptr",
        "_c_sizes",
        "_c_strides",
    )

    def __init__(
        self,
        storage: Storage,
        dtype: int,
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
    ) -> None:
        self.storage = storage
        self.dtype = dtype
        self.sizes = sizes
        self.strides = strides
        self.offset = offset
        self.data_ptr = storage.ptr + offset * ITEMSIZE[dtype]
        self._c_sizes = None
        self._c_strides = None

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def c_sizes(self) -> int:
        """Address of an ``int64_t[ndim]`` that lives as long as this tensor."""
        if self._c_sizes is None:
            self._c_sizes = (ctypes.c_int64 * max(len(self.sizes), 1))(*self.sizes)
        return ctypes.addressof(self._c_sizes)

    def c_strides(self) -> int:
        if self._c_strides is None:
            self._c_strides = (ctypes.c_int64 * max(len(self.strides), 1))(*self.strides)
        return ctypes.addressof(self._c_strides)

    def torch(self) -> torch.Tensor:
        """An ATen view of exactly this tensor's elements in the shim storage (no copy)."""
        return self.storage.typed(self.dtype).as_strided(self.sizes, self.strides, self.offset)


def tensor_from_torch(t: torch.Tensor, storage: Storage) -> Tensor:
    """Describe ``t`` as a view of ``storage`` (which holds ``t``'s memory)."""
    if t.dtype not in TORCH_TO_DTYPE:
        raise ShimError(f"unsupported dtype {t.dtype}")
    dtype = TORCH_TO_DTYPE[t.dtype]
    delta = t.data_ptr() - storage.ptr
    if delta % ITEMSIZE[dtype]:
        raise ShimError(f"tensor data at {t.data_ptr():#x} is not element-aligned in its storage")
    return Tensor(storage, dtype, tuple(t.shape), tuple(t.stride()), delta // ITEMSIZE[dtype])
