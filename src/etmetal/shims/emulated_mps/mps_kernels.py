"""Shader libraries, kernel functions, encoding and dispatch: the compute half of ``shim_mps.h``.

What the Metal wrapper does per kernel call (torch's ``cpp_wrapper_mps``)::

    lib  = create_shader_library(msl_source)         once per library (a static in the .so)
    fn   = get_kernel_function(lib, "generated_kernel")
    run_command_block(fn, shared_callback, &std::function)   -> calls back, natively:
        start_encoding(fn); set_arg_tensor(fn, i, t) / set_arg_int(fn, i, v); dispatch_*(fn, ...)

Handles are opaque non-zero integers keyed in the context's ``MpsState`` tables. The MSL is compiled
and run by the MSL executor (``etmetal.shims.emulated_mps.msl``, Contract B): ``set_arg_tensor``
passes the tensor's data pointer including its storage offset (what upstream's
``setArg`` binds), ``set_arg_int`` a slot this module owns holding the ``int64``.
Threadgroup sizes are chosen as upstream's ``ETMetalKernelFunction::dispatch*`` chooses
them, with a pipeline limit of ``MAX_THREADS_PER_GROUP``.

The wrapper ignores every return code of these calls, so a failure also raises the
device's sticky error (``MpsState.unchecked_error`` of the context): the run that made it fails with
the message instead of returning what an undispatched kernel left in memory.
"""

from __future__ import annotations

import ctypes

from etmetal.shims.registry import ShimTable, put_ptr
from etmetal.shims.storage import ShimError, packed_extent

from . import native_launch
from .limits import check_grid
from .mps_device import Function, Library, mps_state

# this module's shims: registered on a context by whoever builds it, never on import
SHIMS = ShimTable()
shim = SHIMS.shim

MAX_THREADS_PER_GROUP = 1024  # maxTotalThreadsPerThreadgroup of Apple GPUs
MAX_SOURCE_BYTES = 64 << 20
MAX_KEPT_FAULTS = 10_000  # report mode keeps this many faults until check_report takes them

_LIB_BASE = 0x6D70_4C00_0000  # "mpL": library handles
_FN_BASE = 0x6D70_4600_0000  # "mpF": function handles


def _compiler():
    try:
        from . import msl
    except ImportError as exc:
        raise ShimError(
            f"the MSL executor (etmetal.shims.emulated_mps.msl) is not available: {exc}"
        ) from exc
    return msl


def _device_failure(ctx, shim_name: str, exc: BaseException) -> None:
    """Record a failure the Metal wrapper cannot see (it ignores the return code); the
    first one is kept: later failures of the same run are its consequences."""
    st = mps_state(ctx)
    if not st.unchecked_error:
        st.unchecked_error = f"{shim_name}: {exc}"


def _reporting(fn):
    """Re-raise after recording the sticky device error (the bridge turns it into a code)."""

    def wrapper(ctx, *args):
        try:
            return fn(ctx, *args)
        except BaseException as exc:
            _device_failure(ctx, fn.__name__, exc)
            raise

    wrapper.__name__ = fn.__name__
    return shim(wrapper)


def _function(ctx, handle, what: str = "function handle") -> Function:
    if not handle:
        raise ShimError(f"{what} is NULL")
    fn = mps_state(ctx).functions.get(handle)
    if fn is None:
        raise ShimError(
            f"{what} {handle:#x} is not a live kernel function (its library was deleted, "
            "or it never came from aoti_torch_mps_get_kernel_function)"
        )
    return fn


def _text(ptr, what: str, limit: int) -> str:
    if not ptr:
        raise ShimError(f"{what} is NULL")
    raw = ctypes.string_at(ptr)
    if len(raw) > limit:
        raise ShimError(f"{what} is {len(raw)} bytes, more than the {limit} allowed")
    return raw.decode("utf-8", errors="replace")


# --- libraries and functions --------------------------------------------------------------


@_reporting
def aoti_torch_mps_create_shader_library(ctx, metal_shader_source, library_handle):
    if not library_handle:
        raise ShimError("output pointer library_handle is NULL")
    source = _text(metal_shader_source, "metal_shader_source", MAX_SOURCE_BYTES)
    msl = _compiler()
    try:
        compiled = msl.compile_library(source)
    except msl.MslError as exc:
        raise ShimError(f"the shader library failed to compile: {exc}") from None
    st = mps_state(ctx)
    handle = _LIB_BASE + (st.next_id() << 4)
    st.libraries[handle] = Library(handle, compiled, source=source)
    st.stats["libraries_created"] += 1
    put_ptr(library_handle, handle, "library_handle")


@_reporting
def aoti_torch_mps_delete_shader_library(ctx, library_handle):
    if not library_handle:
        raise ShimError("library_handle is NULL")
    st = mps_state(ctx)
    lib = st.libraries.pop(library_handle, None)
    if lib is None:
        raise ShimError(f"library handle {library_handle:#x} is not a live shader library")
    for fn_handle in lib.functions.values():
        st.functions.pop(fn_handle, None)
        native_launch.forget(ctx, fn_handle)


@_reporting
def aoti_torch_mps_get_kernel_function(ctx, library_handle, kernel_name, function_handle):
    if not function_handle:
        raise ShimError("output pointer function_handle is NULL")
    if not library_handle:
        raise ShimError("library_handle is NULL")
    st = mps_state(ctx)
    lib = st.libraries.get(library_handle)
    if lib is None:
        raise ShimError(f"library handle {library_handle:#x} is not a live shader library")
    name = _text(kernel_name, "kernel_name", 4096)
    handle = lib.functions.get(name)
    if handle is None:
        msl = _compiler()
        try:
            kernel = lib.compiled.function(name)
        except msl.MslError as exc:
            known = ", ".join(getattr(lib.compiled, "kernel_names", ())) or "none"
            raise ShimError(
                f"kernel {name!r} is not in the shader library (its kernels: {known}): {exc}"
            ) from None
        handle = _FN_BASE + (st.next_id() << 4)
        indices = frozenset(getattr(kernel, "buffer_indices", ()))
        kinds = dict(getattr(kernel, "arg_kinds", None) or {})
        fn = Function(handle, library_handle, name, kernel, indices, kinds=kinds)
        st.functions[handle] = fn
        lib.functions[name] = handle
        native_launch.register(ctx, fn, _limit(fn))  # its launches are C's from now on
    put_ptr(function_handle, handle, "function_handle")


# --- encoding -----------------------------------------------------------------------------


@_reporting
def aoti_torch_mps_start_encoding(ctx, func):
    fn = _function(ctx, func)
    fn.encoding = True
    fn.args, fn.what, fn.slots, fn.tensors = {}, {}, [], {}


def _encoding(ctx, func, call: str) -> Function:
    fn = _function(ctx, func)
    if not fn.encoding:
        raise ShimError(
            f"kernel {fn.name!r}: {call} without aoti_torch_mps_start_encoding (no active encoder)"
        )
    return fn


def _check_index(fn: Function, idx: int) -> None:
    if idx < 0 or idx > 30:  # Metal's buffer argument table has 31 entries
        raise ShimError(f"kernel {fn.name!r}: buffer index {idx} is outside Metal's [0, 30]")


@_reporting
def aoti_torch_mps_set_arg_tensor(ctx, func, idx, tensor):
    fn = _encoding(ctx, func, "set_arg_tensor")
    _check_index(fn, idx)
    t = ctx.lookup(tensor, f"kernel {fn.name!r} buffer({idx}) tensor")
    kind = fn.kinds.get(idx)
    if kind is not None and kind[0] != "buffer":
        _check_scalar_from_tensor(fn, idx, kind, t)
    fn.args[idx] = t.data_ptr  # includes the storage offset, as upstream's setArg binds
    fn.what[idx] = f"tensor {tensor:#x}"
    fn.tensors[idx] = t


@_reporting
def aoti_torch_mps_set_arg_int(ctx, func, idx, val):
    fn = _encoding(ctx, func, "set_arg_int")
    _check_index(fn, idx)
    kind = fn.kinds.get(idx)
    if kind is not None and (kind[0] != "int" or kind[1] > 8):
        raise ShimError(
            f"kernel {fn.name!r}: set_arg_int into [[buffer({idx})]], which takes "
            f"{_describe(kind)}: an int64 fits only an integer parameter of up to 8 bytes"
        )
    fn.tensors.pop(idx, None)
    slot = ctypes.c_int64(val)  # `constant long& n [[buffer(i)]]` reads it by address
    fn.slots.append(slot)
    fn.args[idx] = ctypes.addressof(slot)
    fn.what[idx] = f"int {val}"


def _describe(kind: tuple[str, int]) -> str:
    name, size = kind
    if name == "buffer":
        return "a buffer (a device/constant pointer)"
    if name == "threadgroup":
        return "threadgroup memory"
    return f"a {size}-byte {name} {'value' if name == 'bytes' else 'scalar'}"


def _check_scalar_from_tensor(fn: Function, idx: int, kind: tuple[str, int], t) -> None:
    """A tensor bound where the kernel reads a value by reference must hold those bytes."""
    if kind[0] == "threadgroup":
        raise ShimError(
            f"kernel {fn.name!r}: [[buffer({idx})]] is threadgroup memory; no set_arg_* binds it"
        )
    have = t.storage.ptr + t.storage.nbytes - t.data_ptr
    if have < kind[1]:
        raise ShimError(
            f"kernel {fn.name!r}: set_arg_tensor into [[buffer({idx})]], which reads "
            f"{_describe(kind)}, with a tensor holding only {max(have, 0)} bytes"
        )


# --- dispatch -----------------------------------------------------------------------------


def _read_u64s(ptr, n: int, what: str) -> tuple[int, ...]:
    if n < 1 or n > 3:
        raise ShimError(f"{what} has {n} entries; a Metal grid has 1 to 3 dimensions")
    if not ptr:
        raise ShimError(f"{what} is NULL")
    return tuple((ctypes.c_uint64 * n).from_address(ptr))


def _limit(fn: Function) -> int:
    """The pipeline's maxTotalThreadsPerThreadgroup (lower for kernels that declare one)."""
    return min(MAX_THREADS_PER_GROUP, getattr(fn.kernel, "max_threads_per_group", 1 << 30))


def _default_group(threads: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """Upstream's choice when the wrapper gives no group size."""
    if len(threads) == 1:
        return (min(limit, threads[0]),)
    if len(threads) == 2:
        gx = min(32, threads[0])
        return (gx, limit // max(gx, 1))
    gx, gy = min(8, threads[0]), min(8, threads[1])
    return (gx, gy, limit // max(gx * gy, 1))


def _group_with(threads: tuple[int, ...], group: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """Upstream's choice with the wrapper's group size (1-D: capped at the pipeline limit)."""
    if len(threads) == 1:
        return (min(limit, group[0]),)
    if len(group) < len(threads):  # upstream then keeps its default
        return _default_group(threads, limit)
    return tuple(min(g, t) for g, t in zip(group, threads))


def _dispatch(ctx, fn: Function, threads: tuple[int, ...], group: tuple[int, ...]) -> None:
    # non-uniform threadgroups: a group never spans more than the grid in any dimension
    group = tuple(max(1, min(g, t)) for g, t in zip(group, threads))
    total = 1
    for g in group:
        total *= g
    if total > _limit(fn):
        raise ShimError(
            f"kernel {fn.name!r}: threadgroup of {total} threads exceeds the pipeline's "
            f"{_limit(fn)}"
        )
    if fn.args.keys() != fn.indices:
        _refuse_arguments(fn)
    for idx, t in fn.tensors.items():
        if t.storage.count <= 0:  # its last tensor was deleted: the memory is gone
            raise ShimError(
                f"kernel {fn.name!r}: the {fn.what[idx]} bound to [[buffer({idx})]] was "
                "deleted before the dispatch (use after free)"
            )
    check_grid(threads, lambda m: ShimError(f"kernel {fn.name!r}: {m}"))
    fn.encoding = False  # upstream drops the encoder after a dispatch
    if 0 in threads:
        return  # an empty grid runs no thread
    msl = _compiler()
    st = mps_state(ctx)
    try:
        if st.check is None:
            fn.kernel.dispatch(dict(fn.args), threads, group)
        else:
            _checked_dispatch(st, fn, threads, group, msl)
    except msl.MslError as exc:
        raise ShimError(f"kernel {fn.name!r}: {exc}") from None
    st.stats["dispatches"] += 1


def _checked_dispatch(st, fn: Function, threads, group, msl) -> None:
    """Run the checked build of ``fn``'s kernel; its faults fail the dispatch (MslError) or,
    in ``report`` mode, are kept on the device."""
    if fn.checked is None:
        source = st.libraries[fn.library].source
        fn.checked = msl.compile_library(source, checked=True).function(fn.name)
    faults = fn.checked.check(
        dict(fn.args), threads, group, extents=_extents(fn), checks=sorted(st.check.checks)
    )
    if not faults:
        return
    if st.check.collect:
        room = max(MAX_KEPT_FAULTS - len(st.check_faults), 0)
        st.check_faults.extend(faults[:room])
        st.stats["check_faults_dropped"] = st.stats.get("check_faults_dropped", 0) + max(
            len(faults) - room, 0
        )
    else:
        raise msl.MetalCheckError(faults, fn.checked.last_check[1])


def _extents(fn: Function) -> dict[int, int]:
    """What the checker holds each binding to: a bound tensor's elements (first to last
    byte, within its storage), a ``set_arg_int`` slot's 8 bytes. Made in check mode only."""
    out = {}
    for idx in fn.args:
        t = fn.tensors.get(idx)
        if t is None:
            out[idx] = 8
        else:
            room = max(t.storage.ptr + t.storage.nbytes - t.data_ptr, 0)
            out[idx] = min(packed_extent(t.sizes, t.strides) * t.itemsize, room)
    return out


def _refuse_arguments(fn: Function) -> None:
    """The error for a dispatch whose bound buffer indices are not the kernel's."""
    given = set(fn.args)
    missing, extra = sorted(fn.indices - given), sorted(given - fn.indices)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing buffer index(es) {missing}")
        if extra:
            parts.append(f"extra argument index(es) {extra} the kernel does not take")
        raise ShimError(f"kernel {fn.name!r}: {'; '.join(parts)}")


@_reporting
def aoti_torch_mps_dispatch_single(ctx, func, length):
    fn = _encoding(ctx, func, "dispatch_single")
    _dispatch(ctx, fn, (length,), _default_group((length,), _limit(fn)))


@_reporting
def aoti_torch_mps_dispatch_single_with_group_size(ctx, func, length, group_size):
    fn = _encoding(ctx, func, "dispatch_single_with_group_size")
    limit = _limit(fn)
    group = min(group_size, limit) if group_size > 0 else None
    _dispatch(ctx, fn, (length,), (group,) if group else _default_group((length,), limit))


@_reporting
def aoti_torch_mps_dispatch_array(ctx, func, length, length_size):
    fn = _encoding(ctx, func, "dispatch_array")
    threads = _read_u64s(length, length_size, "length")
    _dispatch(ctx, fn, threads, _default_group(threads, _limit(fn)))


@_reporting
def aoti_torch_mps_dispatch_array_with_group_size(
    ctx, func, length, length_size, group_size, group_size_size
):
    fn = _encoding(ctx, func, "dispatch_array_with_group_size")
    threads = _read_u64s(length, length_size, "length")
    limit = _limit(fn)
    if group_size and group_size_size:
        group = _group_with(threads, _read_u64s(group_size, group_size_size, "group_size"), limit)
    else:
        group = _default_group(threads, limit)
    _dispatch(ctx, fn, threads, group)


# --- command blocks -----------------------------------------------------------------------


@_reporting
def aoti_torch_mps_run_command_block(ctx, func, callback, user_data):
    """Validation only: the bridge then calls ``callback(func, user_data)`` natively
    (``bridge_source.cpp``), so the C++ ``std::function`` never passes through Python."""
    _function(ctx, func)
    if not callback:
        raise ShimError("callback is NULL")


def library_count(ctx) -> int:
    return len(mps_state(ctx).libraries)
