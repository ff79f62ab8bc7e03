"""Shim tables (C name -> Python implementation) and the C-pointer helpers shims share.

Each implementation is a plain function named exactly like its C symbol, taking its
``ShimContext`` and then the C arguments as Python ints/floats (pointers arrive as
ints, NULL as ``None``): ``fn(ctx, *c_args)``. Every shim module keeps its own
``ShimTable`` (``SHIMS = ShimTable(); shim = SHIMS.shim``); nothing is registered
anywhere by importing it. A context gets shims only through an explicit
``ctx.register_shims(table)`` (``standard_context`` does it for the standard set).
Out-parameters are written with the ``put_*`` helpers. Raising ``ShimError`` (or
anything else) makes the bridge return AOTI_TORCH_FAILURE and record the message.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable

from .storage import ShimError

MAX_NDIM = 64

_i64 = ctypes.c_int64
_i32 = ctypes.c_int32
_u64 = ctypes.c_uint64
_ptr = ctypes.c_void_p
_bool = ctypes.c_bool
_f64 = ctypes.c_double
_f32 = ctypes.c_float
_string_at = ctypes.string_at
_I64_ARRAYS = tuple(_i64 * n for n in range(MAX_NDIM + 1))  # int64_t[n] types, made once


class ShimTable(dict[str, Callable]):
    """One module's shims: C name -> ``fn(ctx, *c_args)``."""

    def shim(self, fn: Callable) -> Callable:
        """Decorator: ``fn`` implements the C symbol of the same name."""
        self[fn.__name__] = fn
        return fn

    def add(self, name: str, fn: Callable) -> None:
        """``fn`` implements ``name`` (one implementation, several device prefixes)."""
        self[name] = fn


def check_ndim(ndim: int) -> int:
    if ndim < 0 or ndim > MAX_NDIM:
        raise ShimError(f"ndim must be in [0, {MAX_NDIM}], got {ndim}")
    return ndim


def read_i64s(addr: int | None, n: int, what: str) -> tuple[int, ...]:
    """``n`` int64 values at ``addr`` (a ``const int64_t*``)."""
    if n == 0:
        return ()
    if n < 0:
        raise ShimError(f"{what}: length {n} is negative")
    if not addr:
        raise ShimError(f"{what} is NULL but {n} values were expected")
    array = _I64_ARRAYS[n] if n <= MAX_NDIM else _i64 * n
    return tuple(array.from_address(addr)[:])


def read_i32s(addr: int | None, n: int, what: str) -> tuple[int, ...]:
    if n == 0:
        return ()
    if not addr:
        raise ShimError(f"{what} is NULL but {n} values were expected")
    return struct.unpack(f"={n}i", _string_at(addr, 4 * n))


def _target(addr: int | None, what: str) -> int:
    if not addr:
        raise ShimError(f"output pointer {what} is NULL")
    return addr


def put_i64(addr: int | None, value: int, what: str = "ret") -> None:
    _i64.from_address(_target(addr, what)).value = value


def put_i32(addr: int | None, value: int, what: str = "ret") -> None:
    _i32.from_address(_target(addr, what)).value = value


def put_u64(addr: int | None, value: int, what: str = "ret") -> None:
    _u64.from_address(_target(addr, what)).value = value


def put_ptr(addr: int | None, value: int, what: str = "ret") -> None:
    _ptr.from_address(_target(addr, what)).value = value


def put_bool(addr: int | None, value: bool, what: str = "ret") -> None:
    _bool.from_address(_target(addr, what)).value = value


def put_f64(addr: int | None, value: float, what: str = "ret") -> None:
    _f64.from_address(_target(addr, what)).value = value


def put_f32(addr: int | None, value: float, what: str = "ret") -> None:
    _f32.from_address(_target(addr, what)).value = value


def read_ptr(addr: int | None, what: str) -> int | None:
    """Dereference a ``T**`` (an optional handle argument); NULL pointer -> None."""
    if not addr:
        return None
    return _ptr.from_address(addr).value


def read_opt_i64(addr: int | None) -> int | None:
    """Dereference an optional ``int64_t*``."""
    if not addr:
        return None
    return _i64.from_address(addr).value


def read_f64(addr: int | None) -> float | None:
    """Dereference an optional ``double*``."""
    if not addr:
        return None
    return _f64.from_address(addr).value


def need_out(*pairs: tuple[int | None, str]) -> None:
    """Check every output pointer before anything is created (so a failure leaks nothing)."""
    for addr, what in pairs:
        _target(addr, what)


def out_slot(addr: int | None, what: str) -> ctypes.c_void_p:
    """The ``AtenTensorHandle*`` at ``addr``, checked (``ShimContext.emit`` writes it)."""
    return _ptr.from_address(_target(addr, what))
