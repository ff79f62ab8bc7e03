"""The emulated Metal device's launch path in C (``mps_encoder.cpp``), from Python's side.

A kernel launch is six shim calls (command block, start_encoding, the arguments, dispatch).
Served in Python they cost about 13 us, more than the executor's own run of a small
kernel; in C they cost well under a microsecond. So when ``get_kernel_function`` (Python,
load time) makes a function whose kernel the MSL executor compiled, :func:`register` hands
it to the bridge: its executor entry, its argument set (indices, kinds and sizes, checked
against on every set_arg and dispatch without Python) and its threadgroup limit. From then
on the bridge serves that handle's launches; Python serves everything else.

C serves only while :func:`sync` says so: the context's implementation is native (the
bridge's fallback switch, ``ShimContext.sync_native_policy``) and the checker is off (a
checked dispatch runs the checked build, through Python). Errors found in C are reported
through :func:`_fail` with the Python shims' own messages, and raise the device's sticky
error as ``mps_kernels`` does.
"""

from __future__ import annotations

import ctypes

import torch

from etmetal.shims.storage import ShimError

from . import limits
from .mps_device import Function, MpsState, mps_state

_FAIL = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p)
_ROOM = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
# msl_compat.h's argument kinds -> mps_encoder.cpp's codes (ETM_ARG_*)
_KIND_CODES = {"buffer": 1, "int": 2, "float": 3, "bytes": 4, "threadgroup": 5}


def _bridge_lib(ctx):
    bridge = getattr(ctx, "bridge", None)
    return None if bridge is None else bridge.lib


def _bind_callbacks(ctx, st: MpsState, lib) -> None:
    """The C side's error report and its rare question (a tensor's room), bound once."""
    if st.native_callbacks:
        return

    def fail(shim: bytes, message: bytes) -> None:
        name, text = shim.decode(), message.decode(errors="replace")
        ctx.record_error(name, text)
        if not st.unchecked_error:  # the first failure of a run, as mps_kernels keeps it
            st.unchecked_error = f"{name}: {text}"

    def room(handle: int) -> int:
        try:
            t = ctx.lookup(handle)
        except ShimError:
            return -1
        return t.storage.ptr + t.storage.nbytes - t.data_ptr

    callbacks = (_FAIL(fail), _ROOM(room))
    ctypes.c_void_p.in_dll(lib, "etm_mps_fail").value = ctypes.cast(
        callbacks[0], ctypes.c_void_p
    ).value
    ctypes.c_void_p.in_dll(lib, "etm_mps_room").value = ctypes.cast(
        callbacks[1], ctypes.c_void_p
    ).value
    st.native_callbacks = callbacks  # C holds raw pointers to these


def sync(ctx, st: MpsState | None = None) -> None:
    """Switch the C launch path on or off for ``ctx`` (off while the checker runs)."""
    lib = _bridge_lib(ctx)
    if lib is None:
        return
    st = st or mps_state(ctx)
    if sync not in st.mode_hooks:  # the checker's mode switches this path from now on
        st.mode_hooks.append(sync)
    _bind_callbacks(ctx, st, lib)
    ctypes.c_uint64.in_dll(lib, "etm_mps_launch_limit").value = limits.launch_limit
    # as msl.py's own dispatch does per call; read here, at every function fetch
    ctypes.c_uint32.in_dll(lib, "etm_mps_workers").value = max(1, torch.get_num_threads())
    on = st.check is None and st.native_launch
    ctypes.c_int64.in_dll(lib, "etm_mps_native").value = int(on)


def set_native_launch(ctx, on: bool) -> bool:
    """Serve ``ctx``'s launches in C (the default) or all in Python; returns the previous
    choice."""
    st = mps_state(ctx)
    previous, st.native_launch = st.native_launch, on
    sync(ctx, st)
    return previous


def register(ctx, fn: Function, limit: int) -> bool:
    """Hand ``fn`` to the bridge's launch path; False if it stays Python's (a kernel the
    MSL executor did not compile, such as a test's stand-in, or no bridge)."""
    lib = _bridge_lib(ctx)
    entry = getattr(fn.kernel, "_entry", None)
    run = getattr(fn.kernel, "_dispatch", None)
    if lib is None or not entry or run is None:
        return False
    sync(ctx)
    indices = sorted(fn.indices)
    kinds = [fn.kinds.get(i, ("", 0)) for i in indices]
    n = len(indices)
    arr = ctypes.c_int32 * max(n, 1)
    rc = lib.etm_mps_fn_add(
        ctypes.c_void_p(fn.handle),
        ctypes.c_void_p(entry),
        ctypes.c_void_p(getattr(fn.kernel, "_loop", None)),
        ctypes.cast(run, ctypes.c_void_p),
        fn.name.encode(),
        ctypes.c_int32(n),
        arr(*indices),
        arr(*(_KIND_CODES.get(k, 0) for k, _ in kinds)),
        arr(*(b for _, b in kinds)),
        ctypes.c_uint64(limit),
    )
    return rc == 0


def forget(ctx, handle: int) -> None:
    """The function ``handle`` is gone (its library was deleted)."""
    lib = _bridge_lib(ctx)
    if lib is not None:
        lib.etm_mps_fn_remove(ctypes.c_void_p(handle))


def dispatches(ctx) -> int:
    """Dispatches ``ctx``'s device ran, from Python and from C."""
    lib = _bridge_lib(ctx)
    native = 0 if lib is None else ctypes.c_uint64.in_dll(lib, "etm_mps_dispatches").value
    return mps_state(ctx).stats["dispatches"] + native
