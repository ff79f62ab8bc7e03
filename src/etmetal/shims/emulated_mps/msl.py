"""Metal shader libraries executed on the CPU (the emulated Metal device's kernels).

::

    lib = compile_library(msl_source)            # cached by content; MslError if it fails
    fn = lib.function("generated_kernel")        # MslError naming an unknown kernel
    fn.dispatch({0: out_ptr, 1: in_ptr, 2: addressof(n_slot)}, threads=(n,), group=None)

``args[i]`` is the address bound to ``[[buffer(i)]]``: the data pointer of a ``device`` /
``constant`` pointer parameter, or for a by-reference scalar (``constant long& n``) the
address of a slot holding the value. ``threads`` is the total thread count per dimension
(Metal's ``dispatchThreads``: tail threadgroups are partial), ``group`` the threadgroup size
(None: up to 256 threads in x, within the kernel's
``[[max_total_threads_per_threadgroup]]``). Every error is an ``MslError`` naming the kernel.

The checker (``check.py``) runs a checked build of the library::

    checked = compile_library(msl_source, checked=True)   # its own build and cache entry
    faults = checked.function("k").check(args, threads, group, extents={0: nbytes, ...})

``extents[i]`` is the byte size of the memory bound to a ``device``/``constant`` pointer
``[[buffer(i)]]`` (a by-reference scalar's size is the kernel's own); the result lists the
faults (:class:`MetalFault`) found (empty: clean). :class:`MetalCheckError` carries them when a
caller turns them into an error.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from etmetal.shims.emulated_mps import limits
from etmetal.shims.emulated_mps.check import CHECKS, CheckRun, FaultRecord, MetalFault, faults_of
from etmetal.shims.emulated_mps.msl_compiler import (
    CompileError,
    build_library,
    dispatcher_path,
    log_paths,
)
from etmetal.shims.emulated_mps.msl_parse import Kernel, ParseError

__all__ = ["MetalCheckError", "MslError", "MslFunction", "MslLibrary", "compile_library"]

DEFAULT_GROUP = 256
MAX_THREADS_PER_GROUP = 1024
# what a [[buffer(i)]] parameter takes (msl_compat.h's etm::arg_desc): kind code -> name
ARG_KINDS = {1: "buffer", 2: "int", 3: "float", 4: "bytes"}


class MslError(Exception):
    """A shader library or a dispatch failed; the message names the kernel."""

    def __init__(self, message: str, *, kernel: str | None = None, construct: str | None = None):
        super().__init__(message)
        self.kernel = kernel
        self.construct = construct


class MetalCheckError(MslError):
    """A checked dispatch found faults (``faults``: :class:`MetalFault`)."""

    def __init__(self, faults: Sequence[MetalFault], dropped: int = 0):
        lines = [str(f) for f in faults[:8]]
        more = len(faults) - len(lines)
        if more > 0:
            lines.append(f"... and {more} more kind(s) of fault")
        if dropped:
            lines.append(f"... and {dropped} fault(s) not recorded")
        kernel = faults[0].kernel if faults else None
        head = f"the Metal checker found {len(faults)} kind(s) of fault:\n  "
        super().__init__(head + "\n  ".join(lines), kernel=kernel)
        self.faults = list(faults)


MAX_FAULTS = 64  # distinct faults (kind, memory, site) one checked dispatch records
UNKNOWN_EXTENT = (1 << 64) - 1
_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
# Process-wide on purpose, not shim state: a compiled library is immutable code, and dlopen
# maps a path once per process (nor can it be unloaded while a kernel of it may run), so
# every ShimContext shares one library per source text, and the dispatcher they link against.
_lock = threading.Lock()
_libraries: dict[tuple[str, bool, bool], MslLibrary] = {}


@functools.cache  # the dispatcher's dlopen handle: one per process, like the libraries
def _dispatch_fn() -> ctypes._CFuncPtr:
    fn = ctypes.CDLL(str(dispatcher_path())).etm_msl_launch
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.c_uint32,
        ctypes.c_char_p,
        ctypes.c_uint64,
    ]
    return fn


@functools.cache
def _checked_dispatch_fn() -> ctypes._CFuncPtr:
    dll = ctypes.CDLL(str(dispatcher_path()))
    fn = dll.etm_msl_dispatch_checked
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(CheckRun),
        ctypes.c_char_p,
        ctypes.c_uint64,
    ]
    return fn


def checked_accesses() -> int:
    """Checked accesses this process has made (a dispatch of a normal build adds none)."""
    fn = ctypes.CDLL(str(dispatcher_path())).etm_msl_checked_accesses
    fn.restype = ctypes.c_uint64
    return int(fn())


class MslFunction:
    """One kernel of a library, ready to dispatch."""

    def __init__(
        self,
        library: MslLibrary,
        kernel: Kernel,
        entry: int,
        descs: Sequence[int] = (),
        loop: int | None = None,
    ) -> None:
        self.library = library
        self.name = kernel.name
        self.buffer_indices: tuple[int, ...] = kernel.buffer_indices
        # buffer index -> (kind, bytes read): "buffer", "int", "float", "bytes" (what the
        # compiler saw), or "threadgroup" (threadgroup memory, which nothing may bind)
        self.arg_kinds: dict[int, tuple[str, int]] = {}
        tg = {p.buffer for p in kernel.params if p.buffer is not None and p.threadgroup}
        for idx, d in zip(self.buffer_indices, descs):
            kind = "threadgroup" if idx in tg else ARG_KINDS.get(d >> 32, "bytes")
            self.arg_kinds[idx] = (kind, d & 0xFFFFFFFF)
        self.max_threads_per_group = kernel.max_threads or MAX_THREADS_PER_GROUP
        self._entry = entry
        # the loop entry of a kernel that never synchronises, or a split kernel's entry (None:
        # its threads are fibers)
        self._loop = loop
        self.synchronises: bool = kernel.sync  # may reach a barrier or SIMD-group operation
        # "loop", "split" (loops between its synchronising statements) or "fibers", and why
        self.path: str = kernel.path if loop is not None or kernel.path == "fibers" else "fibers"
        self.path_reason: str = kernel.path_reason
        self.runs_as_loop: bool = self.path == "loop"  # its threadgroups run as plain loops
        # a split kernel whose threadgroups run in batches (c10's Welford reduction interleaved)
        self.batched: bool = self.path == "split" and kernel.batch
        self._index_set = frozenset(self.buffer_indices)
        self._slot_type = ctypes.c_void_p * (
            (max(self.buffer_indices) + 1) if self.buffer_indices else 1
        )
        self._dispatch = _dispatch_fn()
        self.last_check = (0, 0)  # the last check(): (checked accesses, faults not recorded)

    def __repr__(self) -> str:
        return f"MslFunction({self.name!r}, buffers={self.buffer_indices})"

    def _error(self, message: str) -> MslError:
        return MslError(f"kernel '{self.name}': {message}", kernel=self.name)

    def _dims(self, what: str, value: Sequence[int]) -> tuple[int, int, int]:
        dims = tuple(value)
        if len(dims) == 3 and all(type(d) is int and d >= 0 for d in dims):
            return dims  # type: ignore[return-value]
        if not 1 <= len(dims) <= 3:
            raise self._error(f"{what} must have 1 to 3 dimensions, got {dims}")
        for d in dims:
            if not isinstance(d, int) or isinstance(d, bool) or d < 0:
                raise self._error(f"{what} must be non-negative integers, got {dims}")
        return tuple(dims) + (1,) * (3 - len(dims))  # type: ignore[return-value]

    def _check_args(self, args: Mapping[int, int]) -> None:
        missing = [i for i in self.buffer_indices if i not in args]
        if missing:
            raise self._error(
                f"no argument for [[buffer({missing[0]})]] (takes {self.buffer_indices})"
            )
        extra = sorted(i for i in args if i not in self._index_set)
        if extra:
            raise self._error(
                f"argument {extra[0]} has no [[buffer({extra[0]})]] parameter "
                f"(takes {self.buffer_indices})"
            )

    def dispatch(
        self,
        args: Mapping[int, int],
        threads: Sequence[int],
        group: Sequence[int] | None = None,
    ) -> None:
        self._run(args, threads, group, None)

    def check(
        self,
        args: Mapping[int, int],
        threads: Sequence[int],
        group: Sequence[int] | None = None,
        *,
        extents: Mapping[int, int],
        checks: Sequence[str] = CHECKS,
    ) -> list[MetalFault]:
        """Dispatch under the checker (a checked library only); the faults it found."""
        if not self.library.checked:
            raise self._error("check() needs the checked build: compile_library(..., checked=True)")
        sizes = []
        for i in range(self._slot_type._length_):
            kind, nbytes = self.arg_kinds.get(i, ("buffer", 0))
            if i not in self._index_set:
                sizes.append(0)
            elif kind == "buffer":
                if i not in extents:
                    raise self._error(f"check() needs the byte extent of [[buffer({i})]]")
                sizes.append(int(extents[i]))
            else:
                sizes.append(nbytes if nbytes else UNKNOWN_EXTENT)
        ext = (ctypes.c_uint64 * len(sizes))(*sizes)
        records = (FaultRecord * MAX_FAULTS)()
        run = CheckRun(ext, len(sizes), MAX_FAULTS, records, 0, 0, 0)
        self._run(args, threads, group, run)
        faults = faults_of(self.name, records[: run.nfaults], self.library.sites, frozenset(checks))
        self.last_check = (run.accesses, run.dropped)
        return faults

    def _run(self, args, threads, group, run) -> None:
        if args.keys() != self._index_set:
            self._check_args(args)
        t = self._dims("threads", threads)
        if group is None:
            g = (max(1, min(t[0], DEFAULT_GROUP, self.max_threads_per_group)), 1, 1)
        else:
            g = self._dims("threadgroup size", group)
            if 0 in g:
                raise self._error(f"threadgroup size {tuple(group)} has a zero dimension")
        if g[0] * g[1] * g[2] > self.max_threads_per_group:
            raise self._error(
                f"threadgroup size {g} exceeds the kernel's {self.max_threads_per_group} threads"
            )
        limits.check_grid(t, self._error)
        slots = self._slot_type()
        for i, a in args.items():
            if type(a) is not int or a <= 0:
                raise self._error(f"argument {i} is not an address: {a!r}")
            slots[i] = a
        err = _error_buffer()
        if run is None:
            # threadgroups over the intra-op threads, as ATen's CPU kernels would use them
            workers = torch.get_num_threads()
            rc = self._dispatch(
                self._entry, self._loop, slots, _U64x3(*t), _U64x3(*g), workers, err, len(err)
            )
        else:
            rc = _checked_dispatch_fn()(
                self._entry, slots, _U64x3(*t), _U64x3(*g), ctypes.byref(run), err, len(err)
            )
        if rc != 0:
            raise self._error(err.value.decode(errors="replace"))


_U64x3 = ctypes.c_uint64 * 3
# each thread's scratch for a failed dispatch's message: written and read within one
# dispatch, so it carries nothing from one call (or context) to the next
_local = threading.local()


def _error_buffer() -> ctypes.Array:
    buf = getattr(_local, "err", None)
    if buf is None:
        buf = _local.err = ctypes.create_string_buffer(600)
    return buf


class MslLibrary:
    """A compiled shader library: its kernels by name."""

    def __init__(
        self, so_path: Path, kernels: list[Kernel], sites: Sequence[object] = (), checked=False
    ) -> None:
        _dispatch_fn()  # the dispatcher first: the library links against it by path
        self.path = so_path
        self.checked = checked  # a checked build (its accesses call the checker)
        self.sites = tuple(sites)  # its checked access sites, by the index the checker reports
        self._dll = ctypes.CDLL(str(so_path))
        self._kernels = {k.name: (k, i) for i, k in enumerate(kernels)}
        self.kernel_names: tuple[str, ...] = tuple(k.name for k in kernels)
        self._functions: dict[str, MslFunction] = {}

    def function(self, name: str) -> MslFunction:
        fn = self._functions.get(name)
        if fn is not None:
            return fn
        if name not in self._kernels:
            raise MslError(
                f"kernel '{name}' is not in the library (it has {list(self.kernel_names)})",
                kernel=name,
            )
        kernel, i = self._kernels[name]
        entry = ctypes.cast(getattr(self._dll, f"etm_msl_entry_{i}"), ctypes.c_void_p).value
        loop = None
        if kernel.path in ("loop", "split") and not self.checked:
            loop = ctypes.cast(getattr(self._dll, f"etm_msl_loop_{i}"), ctypes.c_void_p).value
        n = max(len(kernel.buffer_indices), 1)
        descs = tuple((ctypes.c_ulonglong * n).in_dll(self._dll, f"etm_msl_args_{i}"))
        fn = self._functions[name] = MslFunction(self, kernel, entry, descs, loop)
        return fn


def compile_library(source: str, checked: bool = False, split: bool = True) -> MslLibrary:
    """Compile (or fetch from the cache) a shader library, or its checked build. Raises
    MslError. ``split=False``: synchronising kernels run on fibers only (the reference the split
    path, msl_split.py, is tested against)."""
    if not isinstance(source, str):
        raise MslError(f"a shader library's source must be text, got {type(source).__name__}")
    with _lock:
        lib = _libraries.get((source, checked, split))
        if lib is not None:
            return lib
        try:
            so, kernels, sites = build_library(source, checked, split)
        except CompileError as e:
            build = "the checker's build of the library: " if checked else ""
            raise MslError(
                f"kernel '{e.kernel}': {build}the Metal construct '{e.construct}' is not "
                f"supported on this host ({e.detail})",
                kernel=e.kernel,
                construct=e.construct,
            ) from None
        except ParseError as e:
            raise MslError(f"kernel '{e.kernel}': {e}", kernel=e.kernel) from None
        lib = _libraries[(source, checked, split)] = MslLibrary(so, kernels, sites, checked)
        log_paths(kernels)
        return lib
