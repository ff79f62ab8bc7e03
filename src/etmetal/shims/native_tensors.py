"""Native tensors: the hottest shims (``empty_strided``, ``delete_tensor_object``) served in C.

A model run allocates and frees the same small buffers every time; a round trip into
Python for each costs about 2 us, more than a tiny model's whole run in torch's own
runner. So the trampoline serves them itself: a *native* record owns a host
allocation (from a per-size free cache) or borrows a run's input, and lives in the
upper half of the record table, which C manages as its own FIFO of free slots.

``_reinterpret_tensor`` of a native tensor is served in C too (while the policy is
"view"): a native view is another record over the same allocation, which counts its
references (the records viewing it, and Python's storages) in a header before its data.

Python never has to know about a native tensor unless it touches it: the first
Python shim that looks a native handle up *adopts* it (``ShimContext.lookup``), turning it
into an ordinary ``Tensor`` over a ``Storage`` that holds a reference to the C allocation
(dropped when its last user, shim tensor or ATen view, goes; the memory goes back to the
C cache when no native record views it either). Adopting a second view of the same
allocation reuses that ``Storage``. From then on everything (views, refcounts, errors)
follows the Python object model.

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

from etmetal.shims.abi_codes import ITEMSIZE

# the C side of these is native_tensors.h; check_layout ties the two at load
MAX_DIMS = 8  # ETM_MAX_DIMS
TABLE_SLOTS = (
    32768  # ETM_TABLE_SLOTS: the lower half is Python's (records.Records), the upper native
)
NO_SLOT = -0x7E7  # ETM_NO_SLOT: etm_run found no free native record; nothing ran
NDTYPES = 64  # ETM_NDTYPES: dtype codes etm_itemsize covers
NATIVE_LIMIT = 1 << 20  # largest empty_strided served natively, bytes (bigger: Python's)
# the same on the emulated Metal device (no free cache there: its memory is what models hold)
NATIVE_MPS_LIMIT = 1 << 30
CACHE_LIMIT = 64 << 20  # freed native allocations kept for reuse, bytes

# etm_rec.native: a native allocation, borrowed memory, a storage libtorch made
OWNED, BORROWED, FOREIGN = 1, 2, 3

NATIVE_DIR = Path(__file__).parent
SOURCE = NATIVE_DIR / "native_tensors.cpp"  # linked into the bridge next to the trampoline
# every unit of the native tensors and the header they share (with the trampoline only
# native_tensors.h): what a build linking them compiles and writes
SOURCES = (SOURCE, NATIVE_DIR / "native_lending.cpp", NATIVE_DIR / "native_run.cpp")
RECORDS_HEADER = NATIVE_DIR / "native_records.h"
HEADER = NATIVE_DIR / "native_tensors.h"  # the shared structs, included by both


class LayoutError(RuntimeError):
    """The Python mirror of a struct of ``native_tensors.h`` disagrees with the C compiler."""


# served in C before the call is forwarded to Python (bridge._native_path)
NATIVE_PATHS = {
    "aoti_torch_empty_strided": (
        "  if (etm_native_empty(a0, (const int64_t*)a1, (const int64_t*)a2, a3, a4, a5, (void**)a6)) {\n"
        "    __atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED); return 0; }\n"
    ),
    "aoti_torch__reinterpret_tensor": (
        "  if (etm_native_view(a0, a1, (const int64_t*)a2, (const int64_t*)a3, a4, (void**)a5)) {\n"
        "    __atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED); return 0; }\n"
    ),
    "aoti_torch_delete_tensor_object": (
        "  { etm_rec* r = etm_rec_of(a0);\n"
        "    if (r && r->native) { __atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED);\n"
        "      etm_native_delete(r); return 0; } }\n"
    ),
}


class Record(ctypes.Structure):
    """``etm_rec``: one handle's record (a handle is its record's address)."""

    _fields_ = [
        ("live", ctypes.c_int64),
        ("data_ptr", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("offset", ctypes.c_int64),
        ("numel", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("device_type", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
        ("native", ctypes.c_int64),
        ("storage_bytes", ctypes.c_int64),
    ]


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
        ("proxy", ctypes.c_void_p),
    ]


RECORD_SIZE = ctypes.sizeof(Record)
STRUCTS = {"etm_rec": Record, "etm_out": OutSpec, "etm_call": RunCall}
CONSTANTS = {
    "ETM_MAX_DIMS": MAX_DIMS,
    "ETM_TABLE_SLOTS": TABLE_SLOTS,
    "ETM_NO_SLOT": NO_SLOT,
    "ETM_NDTYPES": NDTYPES,
}

_CODES = {ctypes.c_int64: "q", ctypes.c_int32: "i"}


def struct_format(cls: type[ctypes.Structure]) -> str:
    """The ``struct`` format of a ctypes mirror of integer fields and integer arrays (the
    packers in this module and ``records`` derive theirs from it, so they follow it)."""
    codes = []
    for _, ctype in cls._fields_:
        if issubclass(ctype, ctypes.Array):
            codes.append(f"{ctype._length_}{_CODES[ctype._type_]}")
        else:
            codes.append(_CODES[ctype])
    fmt = "=" + "".join(codes)
    assert struct.calcsize(fmt) == ctypes.sizeof(cls), cls.__name__  # no implicit padding
    return fmt


_RECORD = struct.Struct(struct_format(Record))


class _LayoutEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("size", ctypes.c_int64), ("offset", ctypes.c_int64)]


def python_layout() -> dict[str, tuple[int, int]]:
    """``name -> (size, offset)`` of every constant, struct and field, as Python sees them."""
    out = {name: (value, 0) for name, value in CONSTANTS.items()}
    for cname, cls in STRUCTS.items():
        out[cname] = (ctypes.sizeof(cls), 0)
        for field, _ in cls._fields_:
            desc = getattr(cls, field)
            out[f"{cname}.{field}"] = (desc.size, desc.offset)
    return out


def native_layout(lib: ctypes.CDLL) -> dict[str, tuple[int, int]]:
    """The same table as the C compiler laid it out (``etm_layout`` of native_tensors.cpp)."""
    count = ctypes.c_int64.in_dll(lib, "etm_layout_count").value
    table = (_LayoutEntry * count).in_dll(lib, "etm_layout")
    return {e.name.decode(): (e.size, e.offset) for e in table}


def check_layout(lib: ctypes.CDLL) -> None:
    """Raise LayoutError naming every constant, struct or field the two sides disagree on."""
    py, c = python_layout(), native_layout(lib)
    diffs = [
        f"{name}: C (size, offset) {c.get(name)}, Python {py.get(name)}"
        for name in sorted(set(py) | set(c))
        if py.get(name) != c.get(name)
    ]
    if diffs:
        raise LayoutError(f"{HEADER.name} and native_tensors.py disagree: " + "; ".join(diffs))


@dataclass(frozen=True)
class NativeRecord:
    """What a native record says about its tensor (read when Python adopts it)."""

    kind: int  # OWNED, BORROWED or FOREIGN
    data_ptr: int
    dtype: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    storage_bytes: int
    device_type: int = 0  # the c10 device its tensor reports (13: the emulated Metal device)


def pack_image(
    buffer,
    index: int,
    data_ptr: int,
    dtype: int,
    sizes,
    strides,
    offset: int,
    storage_bytes: int,
    device_type: int = 0,
) -> None:
    """Write record image ``index`` of ``buffer`` (an input ``etm_run`` will borrow, on
    c10 device ``device_type``)."""
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
        device_type,
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
        check_layout(lib)
        self.lib = lib
        self.records_base = records_base
        self.native_base = records_base + (TABLE_SLOTS // 2) * RECORD_SIZE
        self.records_end = records_base + TABLE_SLOTS * RECORD_SIZE
        self._memory = (ctypes.c_char * (TABLE_SLOTS * RECORD_SIZE)).from_address(records_base)
        self._limit = ctypes.c_int64.in_dll(lib, "etm_native_limit")
        self._mps_limit = ctypes.c_int64.in_dll(lib, "etm_native_mps_limit")
        self._cache_limit = ctypes.c_int64.in_dll(lib, "etm_native_cache_limit")
        self._counters = {
            name: ctypes.c_int64.in_dll(lib, f"etm_native_{name}")
            for name in ("live", "borrowed", "bytes", "cached", "stores", "mps_stores", "mps_bytes")
        }
        for name, argtypes, restype in (
            ("etm_native_disown", [ctypes.c_void_p], ctypes.c_int32),
            ("etm_native_delete_handle", [ctypes.c_void_p], ctypes.c_int32),
            ("etm_slot_release", [ctypes.c_void_p], ctypes.c_int32),
            ("etm_block_unref_python", [ctypes.c_void_p], None),
            ("etm_block_native_refs", [ctypes.c_void_p], ctypes.c_int64),
            ("etm_mem_empty_cache", [], None),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        self.run = lib.etm_run
        self.run.argtypes, self.run.restype = [ctypes.c_void_p], ctypes.c_int32
        # what a Python Storage over a native allocation calls when it goes (NativeBlock)
        self.unref_python = lib.etm_block_unref_python
        self._views = ctypes.c_int64.in_dll(lib, "etm_native_views")
        # the fallbacks of native_fallbacks, and its borrowed constants
        self._fallbacks = ctypes.c_int64.in_dll(lib, "etm_native_fallbacks")
        self._borrows = ctypes.c_int64.in_dll(lib, "etm_native_borrows")
        self._alias_log = ctypes.c_void_p.in_dll(lib, "etm_alias_log")
        self._alias_cap = ctypes.c_int64.in_dll(lib, "etm_alias_cap")
        self._alias_len = ctypes.c_int64.in_dll(lib, "etm_alias_len")
        self._lend = lib.etm_native_lend
        self._lend.restype = ctypes.c_void_p
        self._lend.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int32,
            ctypes.c_int64,
        ]
        itemsizes = (ctypes.c_int8 * NDTYPES).in_dll(lib, "etm_itemsize")
        for code, size in ITEMSIZE.items():
            itemsizes[code] = size

    def counter(self, name: str) -> int:
        return self._counters[name].value

    def set_limit(self, nbytes: int) -> None:
        """Serve ``empty_strided`` natively up to ``nbytes`` (0: every allocation in Python)."""
        self._limit.value = nbytes

    def set_mps_limit(self, nbytes: int) -> None:
        """Serve mps ``empty_strided`` (and mps borrows and fallbacks) natively up to
        ``nbytes`` (0: every mps tensor in Python)."""
        self._mps_limit.value = nbytes

    @property
    def mps_limit(self) -> int:
        return self._mps_limit.value

    def set_views(self, on: bool) -> None:
        """Serve ``_reinterpret_tensor`` of native tensors natively (the "view" policy)."""
        self._views.value = int(on)

    def set_fallbacks(self, on: bool) -> None:
        """Serve the fallbacks of ``native_fallbacks`` in C."""
        self._fallbacks.value = int(on)

    @property
    def fallbacks(self) -> bool:
        return bool(self._fallbacks.value)

    @contextlib.contextmanager
    def borrowing(self, on: bool):
        """Inside the block (a container loading its constants), ``create_tensor_from_blob``
        and ``new_tensor_handle`` of native tensors make native borrowed records."""
        previous, self._borrows.value = self._borrows.value, int(on)
        try:
            yield
        finally:
            self._borrows.value = previous

    def lend(
        self, data: int, dtype: int, sizes, strides, offset: int, storage_bytes: int
    ) -> int | None:
        """A native borrowed record over ``storage_bytes`` at ``data`` (a shared constant);
        None when the record table is full or the geometry is not served natively."""
        n = len(sizes)
        if n > MAX_DIMS:
            return None
        sz, st = (ctypes.c_int64 * max(n, 1))(*sizes), (ctypes.c_int64 * max(n, 1))(*strides)
        return self._lend(data, n, sz, st, offset, dtype, storage_bytes) or None

    @contextlib.contextmanager
    def aliases(self, capacity: int):
        """Collect the handles ``new_tensor_handle`` makes in C inside the block (a list,
        filled when the block ends): a container never deletes its constants' aliases."""
        log = (ctypes.c_void_p * max(capacity, 1))()
        made: list[int] = []
        self._alias_cap.value, self._alias_len.value = capacity, 0
        self._alias_log.value = ctypes.addressof(log)
        try:
            yield made
        finally:
            made.extend(log[i] for i in range(self._alias_len.value))
            self._alias_log.value = None
            self._alias_cap.value = self._alias_len.value = 0

    def native_refs(self, data: int) -> int:
        """Native records viewing the allocation at ``data`` (besides Python's storages)."""
        return self.lib.etm_block_native_refs(data)

    def in_native_half(self, handle: int) -> bool:
        return self.native_base <= handle < self.records_end

    def read(self, handle: int) -> NativeRecord | None:
        """The native record at ``handle``, or None when it is not a live native tensor."""
        if not self.in_native_half(handle) or (handle - self.native_base) % RECORD_SIZE:
            return None
        (live, ptr, dim, offset, _, dtype, device_type, *rest) = _RECORD.unpack_from(
            self._memory, handle - self.records_base
        )
        kind, storage_bytes = rest[-2], rest[-1]
        if not live or kind not in (OWNED, BORROWED, FOREIGN):
            return None
        sizes = tuple(rest[:dim])
        strides = tuple(rest[MAX_DIMS : MAX_DIMS + dim])
        return NativeRecord(kind, ptr, dtype, sizes, strides, offset, storage_bytes, device_type)

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
    """Holds Python's reference to one native allocation; drops it when collected (the
    allocation goes back to the C cache once no native record views it either).

    ``array`` is a ctypes view of the bytes that keeps this block alive, so ATen tensors
    made over it (``torch.frombuffer``) keep the memory valid for as long as they live.
    """

    __slots__ = ("ptr", "nbytes", "_unref", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, unref) -> None:
        self.ptr, self.nbytes, self._unref = ptr, nbytes, unref

    def array(self) -> ctypes.Array:
        arr = (ctypes.c_char * max(self.nbytes, 1)).from_address(self.ptr)
        arr._etmetal_owner = self  # the array (and every tensor over it) keeps the block alive
        return arr

    def __del__(self) -> None:
        unref, self._unref = self._unref, None
        if unref is not None:
            with contextlib.suppress(Exception):  # interpreter shutdown: the process is going
                unref(self.ptr)
