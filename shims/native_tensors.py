"""Native tensors: the hottest shims (``empty_strided``, ``delete_tensor_object``) served in C.

A model run allocates and frees the same small buffers every time; a round trip into
Python for each costs about 2 us, more than a tiny model's whole run in torch's own
runner. So the trampoline serves them itself: a *native* record owns a host
allocation (from a per-size free cache) or borrows a run's input, and lives in the
upper half of the record table, which C manages as its own FIFO of free slots.

Python never has to know about a native tensor unless it touches it: the first
Python shim that looks a native handle up *adopts* it (``ShimContext.lookup``), turning it
into an ordinary ``Tensor`` over a ``Storage`` that now owns the C allocation (freed
back to the C cache when its last user, shim tensor or ATen view, goes). From then on
everything (views, refcounts, errors) follows the Python object model.

``etm_run`` is the steady-state run: it writes the input records from images the
model prepared, runs the container, frees what the container left of the inputs, and
copies each native output whose geometry the caller predicted straight into the
caller's tensor, so a small model's run calls Python only once, on entry.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from dataclasses import dataclass
from pathlib import Path

from .dtypes import ITEMSIZE

MAX_DIMS = 8
RECORD_SIZE = 192  # etm_rec below: 5 int64 + 2 int32 + 2 x int64[8] + 2 int64
TABLE_SLOTS = 32768  # the lower half is Python's (records.Records), the upper half native
NATIVE_LIMIT = 1 << 20  # largest empty_strided served natively, bytes (bigger: Python's)
CACHE_LIMIT = 64 << 20  # freed native allocations kept for reuse, bytes
NO_SLOT = -0x7E7  # etm_run: no free native record; nothing ran

OWNED, BORROWED = 1, 2  # etm_rec.native


def _defines() -> str:
    itemsizes = [0] * 64
    for code, size in ITEMSIZE.items():
        itemsizes[code] = size
    return (
        f"#define ETM_RECORD_SIZE {RECORD_SIZE}\n#define ETM_TABLE_SLOTS {TABLE_SLOTS}\n"
        f"#define ETM_NATIVE_LIMIT {NATIVE_LIMIT}\n#define ETM_NO_SLOT ({NO_SLOT})\n"
        f"#define ETM_ITEMSIZES {', '.join(map(str, itemsizes))}\n"
    )


def c_source() -> str:
    """The records, the native allocator and ``etm_run``, for the bridge's generated source."""
    return _defines() + (Path(__file__).parent / "native_tensors.cpp").read_text()


# served in C before the call is forwarded to Python (bridge._native_path)
NATIVE_PATHS = {
    "aoti_torch_empty_strided": (
        "  if (etm_native_empty(a0, (const int64_t*)a1, (const int64_t*)a2, a3, a4, a5, (void**)a6)) {\n"
        "    __atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED); return 0; }\n"
    ),
    "aoti_torch_delete_tensor_object": (
        "  { etm_rec* r = etm_rec_of(a0);\n"
        "    if (r && r->native) { __atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED);\n"
        "      etm_native_delete(r); return 0; } }\n"
    ),
}

INCLUDES = "#include <cstdlib>\n#include <cstring>\n#include <unordered_map>\n#include <vector>\n"


class OutSpec(ctypes.Structure):
    """``etm_out``: the geometry output i is predicted to come back with."""

    _fields_ = [
        ("nbytes", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


class RunCall(ctypes.Structure):
    """``etm_call``: one model's arguments to ``etm_run``, prepared once."""

    _fields_ = [
        ("run", ctypes.c_void_p),
        ("container", ctypes.c_void_p),
        ("images", ctypes.c_void_p),
        ("n_in", ctypes.c_int64),
        ("in_handles", ctypes.c_void_p),
        ("out_handles", ctypes.c_void_p),
        ("n_out", ctypes.c_int64),
        ("outs", ctypes.c_void_p),
        ("dsts", ctypes.c_void_p),
        ("leftover", ctypes.c_int64),
        ("pending", ctypes.c_int64),
    ]


_RECORD = struct.Struct(f"=5q2i{MAX_DIMS}q{MAX_DIMS}q2q")
assert _RECORD.size == RECORD_SIZE


@dataclass(frozen=True)
class NativeRecord:
    """What a native record says about its tensor (read when Python adopts it)."""

    kind: int  # OWNED or BORROWED
    data_ptr: int
    dtype: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    storage_bytes: int


def pack_image(
    buffer, index: int, data_ptr: int, dtype: int, sizes, strides, offset: int, storage_bytes: int
) -> None:
    """Write record image ``index`` of ``buffer`` (an input ``etm_run`` will borrow)."""
    d = len(sizes)
    numel = 1
    for s in sizes:
        numel *= s
    pad = (0,) * (MAX_DIMS - d)
    _RECORD.pack_into(
        buffer,
        index * RECORD_SIZE,
        0,  # live: etm_run sets it
        data_ptr,
        d,
        offset,
        numel,
        dtype,
        0,
        *sizes,
        *pad,
        *strides,
        *pad,
        BORROWED,
        storage_bytes,
    )


class NativeTensors:
    """The bridge's native-tensor functions and counters, bound once the bridge is loaded."""

    def __init__(self, lib: ctypes.PyDLL, records_base: int) -> None:
        self.lib = lib
        self.records_base = records_base
        self.native_base = records_base + (TABLE_SLOTS // 2) * RECORD_SIZE
        self.records_end = records_base + TABLE_SLOTS * RECORD_SIZE
        self._memory = (ctypes.c_char * (TABLE_SLOTS * RECORD_SIZE)).from_address(records_base)
        self._limit = ctypes.c_int64.in_dll(lib, "etm_native_limit")
        self._cache_limit = ctypes.c_int64.in_dll(lib, "etm_native_cache_limit")
        self._counters = {
            name: ctypes.c_int64.in_dll(lib, f"etm_native_{name}")
            for name in ("live", "borrowed", "bytes", "cached")
        }
        for name, argtypes, restype in (
            ("etm_native_disown", [ctypes.c_void_p], ctypes.c_int32),
            ("etm_native_delete_handle", [ctypes.c_void_p], ctypes.c_int32),
            ("etm_slot_release", [ctypes.c_void_p], ctypes.c_int32),
            ("etm_mem_free", [ctypes.c_void_p, ctypes.c_int64], None),
            ("etm_mem_empty_cache", [], None),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        self.run = lib.etm_run
        self.run.argtypes, self.run.restype = [ctypes.c_void_p], ctypes.c_int32
        self.free_memory = lib.etm_mem_free

    def counter(self, name: str) -> int:
        return self._counters[name].value

    def set_limit(self, nbytes: int) -> None:
        """Serve ``empty_strided`` natively up to ``nbytes`` (0: every allocation in Python)."""
        self._limit.value = nbytes

    def in_native_half(self, handle: int) -> bool:
        return self.native_base <= handle < self.records_end

    def read(self, handle: int) -> NativeRecord | None:
        """The native record at ``handle``, or None when it is not a live native tensor."""
        if not self.in_native_half(handle) or (handle - self.native_base) % RECORD_SIZE:
            return None
        (live, ptr, dim, offset, _, dtype, _, *rest) = _RECORD.unpack_from(
            self._memory, handle - self.records_base
        )
        kind, storage_bytes = rest[-2], rest[-1]
        if not live or kind not in (OWNED, BORROWED):
            return None
        sizes = tuple(rest[:dim])
        strides = tuple(rest[MAX_DIMS : MAX_DIMS + dim])
        return NativeRecord(kind, ptr, dtype, sizes, strides, offset, storage_bytes)

    def disown(self, handle: int) -> None:
        if self.lib.etm_native_disown(handle):
            raise RuntimeError(f"handle {handle:#x} is not a native tensor")

    def delete(self, handle: int) -> bool:
        """Delete a live native handle; False when ``handle`` is not one."""
        return self.lib.etm_native_delete_handle(handle) == 0

    def release_slot(self, handle: int) -> None:
        self.lib.etm_slot_release(handle)

    def set_caching(self, on: bool) -> None:
        """Keep freed allocations for reuse (while models are open) or free them at once."""
        self._cache_limit.value = CACHE_LIMIT if on else 0
        if not on:
            self.lib.etm_mem_empty_cache()


class NativeBlock:
    """Owns one native allocation adopted by Python; frees it into the C cache when collected.

    ``array`` is a ctypes view of the bytes that keeps this block alive, so ATen tensors
    made over it (``torch.frombuffer``) keep the memory valid for as long as they live.
    """

    __slots__ = ("ptr", "nbytes", "_free", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, free) -> None:
        self.ptr, self.nbytes, self._free = ptr, nbytes, free

    def array(self) -> ctypes.Array:
        arr = (ctypes.c_char * max(self.nbytes, 1)).from_address(self.ptr)
        arr._etmetal_owner = self  # the array (and every tensor over it) keeps the block alive
        return arr

    def __del__(self) -> None:
        free, self._free = self._free, None
        if free is not None:
            with contextlib.suppress(Exception):  # interpreter shutdown: the process is going
                free(self.ptr, self.nbytes)
