"""Lend constants to an AOTI model container instead of letting it copy a weights blob.

``AOTInductorModelUpdateConstantsFromBlob`` mallocs a buffer the size of all constants and
copies them in, so every container holds its own copy. A container also accepts
*user-managed* constants (``AOTInductorModelContainerUpdateUserManagedConstantBufferPairs``):
tensor handles it uses as they are and never frees. Handing several containers the same
handles makes them read one copy of each weight.

Before lending, every constant the ``.so`` stores (all but the folded ones, which it
computes itself on the first run) is checked against the tensor offered for it: same
name, dtype and byte size, so a stale or foreign table is an error naming the constant.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from etmetal.shims.abi_codes import TORCH_TO_DTYPE

from .storage import ShimError, Storage, tensor_from_torch


class NativeLender(Protocol):
    """What lending needs of the bridge's native tensors (``native_tensors.NativeTensors``)."""

    def lend(
        self, data: int, dtype: int, sizes, strides, offset: int, storage_bytes: int
    ) -> int | None: ...


class ConstantEntry(ctypes.Structure):
    """``AOTInductorConstantMapEntry`` of torch's ``aoti_runtime/interface.h``."""

    _fields_ = [("name", ctypes.c_char_p), ("handle", ctypes.c_void_p)]


_QUERIES = {
    "AOTInductorModelContainerGetConstantName": ctypes.POINTER(ctypes.c_char_p),
    "AOTInductorModelContainerGetConstantFromFolded": ctypes.POINTER(ctypes.c_bool),
    "AOTInductorModelContainerGetConstantDtype": ctypes.POINTER(ctypes.c_int32),
    "AOTInductorModelContainerGetConstantDataSize": ctypes.POINTER(ctypes.c_size_t),
}
_UPDATE = "AOTInductorModelContainerUpdateUserManagedConstantBufferPairs"


def bind(lib: ctypes.CDLL, so_name: str) -> None:
    """Set the argument types of the constant-table calls (error if the .so lacks one)."""
    vp = ctypes.c_void_p
    for name, out in _QUERIES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            raise ShimError(f"{so_name} has no {name}: cannot lend it shared constants")
        fn.argtypes, fn.restype = [vp, ctypes.c_size_t, out], ctypes.c_int32
    fn = getattr(lib, _UPDATE, None)
    if fn is None:
        raise ShimError(f"{so_name} has no {_UPDATE}: cannot lend it shared constants")
    fn.argtypes = [vp, ctypes.POINTER(ConstantEntry), ctypes.c_size_t, ctypes.c_bool, ctypes.c_bool]
    fn.restype = ctypes.c_int32


def stored_constants(
    lib: ctypes.CDLL, container: ctypes.c_void_p, count: int, check: Callable[[int, str], None]
) -> list[tuple[str, int, int]]:
    """(name, dtype code, data size) of each constant the ``.so`` expects from outside."""
    found = []
    for i in range(count):
        name, folded = ctypes.c_char_p(), ctypes.c_bool()
        dtype, size = ctypes.c_int32(), ctypes.c_size_t()
        check(
            lib.AOTInductorModelContainerGetConstantFromFolded(container, i, ctypes.byref(folded)),
            "reading the constant table",
        )
        if folded.value:
            continue
        check(
            lib.AOTInductorModelContainerGetConstantName(container, i, ctypes.byref(name)),
            "reading the constant table",
        )
        check(
            lib.AOTInductorModelContainerGetConstantDtype(container, i, ctypes.byref(dtype)),
            "reading the constant table",
        )
        check(
            lib.AOTInductorModelContainerGetConstantDataSize(container, i, ctypes.byref(size)),
            "reading the constant table",
        )
        found.append(((name.value or b"").decode(), dtype.value, size.value))
    return found


def check_offered(
    expected: list[tuple[str, int, int]], offered: Mapping[str, torch.Tensor], so_name: str
) -> None:
    """Every stored constant has a tensor of its dtype whose storage holds its bytes."""
    names = {name for name, _, _ in expected}
    extra = sorted(set(offered) - names)
    if extra:
        raise ShimError(f"{so_name}: offered constants the .so does not have: {extra[:5]}")
    for name, dtype, size in expected:
        t = offered.get(name)
        if t is None:
            raise ShimError(f"{so_name}: no tensor offered for constant {name!r}")
        if TORCH_TO_DTYPE.get(t.dtype) != dtype:
            raise ShimError(
                f"{so_name}: constant {name!r} is dtype code {dtype} in the .so, the offered "
                f"tensor is {t.dtype}"
            )
        # the .so reads its data_size from the tensor's data pointer on: count the bytes
        # from there to the end of the storage, not the storage's whole size
        have = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        if have < size - 63 or not t.is_cpu:  # the .so's data_size is padded to 64
            raise ShimError(
                f"{so_name}: constant {name!r} needs {size} bytes on the cpu, the offered "
                f"tensor's storage has {have} ({t.device})"
            )


def lend(
    lib: ctypes.CDLL,
    container: ctypes.c_void_p,
    offered: Mapping[str, torch.Tensor],
    register: Callable[[object], int],
    unregister: Callable[[int], None],
    device_type: int,
    check: Callable[[int, str], None],
    native: NativeLender | None = None,
) -> list[int]:
    """Register a shim tensor over each offered constant and hand the handles to the
    container; returns the handles (the caller deletes them after the container).

    With ``native`` (the bridge's native tensors), each constant is a native borrowed
    record instead, so the container's views and deletes of it stay in C (a constant C
    cannot describe is Python's, as without)."""
    handles: list[int] = []
    names = list(offered)
    pairs = (ConstantEntry * max(len(names), 1))()
    encoded = [n.encode() for n in names]  # kept alive across the call
    for i, (name, raw) in enumerate(zip(names, encoded)):
        t = offered[name]
        untyped = t.untyped_storage()
        handle = None
        code = TORCH_TO_DTYPE.get(t.dtype)
        if native is not None and code is not None and t.numel():
            handle = native.lend(
                untyped.data_ptr(),
                code,
                tuple(t.shape),
                t.stride(),
                t.storage_offset(),
                untyped.nbytes(),
            )
        if handle is None:
            storage = Storage(
                untyped.data_ptr(), untyped.nbytes(), owned=False, device_type=device_type
            )
            handle = register(tensor_from_torch(t, storage))
        handles.append(handle)
        pairs[i].name, pairs[i].handle = raw, handle
    try:
        check(
            lib.AOTInductorModelContainerUpdateUserManagedConstantBufferPairs(
                container, pairs, len(names), False, True
            ),
            "lending the shared constants",
        )
    except BaseException:
        for handle in handles:
            unregister(handle)
        raise
    return handles
