"""The constants of a Metal delegate in the shared-weights layout, loaded once per program.

A delegate whose processed bytes name a weights index (``etmetal.common.weights_index``)
gets its constants as tensors over the program's named data instead of a blob the ``.so``
copies: read-only constants are lent in place, so every method's delegate reads one copy
of each weight. A constant is checked against the sha256 in its key once per program.

Mutable constants (the buffers a method writes, e.g. its KV cache) get a writable copy of
their initial bytes: one per delegate, as the exported methods declare, or one per
program when the program was lowered with ``share_mutable_buffers`` (then every method
that names the buffer reads and writes the same memory).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from etmetal.common.delegate_blobs import key_digest
from etmetal.common.scalar_types import SCALAR_TYPE_CODES
from etmetal.common.weights_index import ConstantEntry, decode_index

from .errors import IntegrityError, InvalidProgramError

ALIGNMENT = 64  # AOTI allocates its own constants at this alignment; lend no less
_DTYPES = {code: getattr(torch, name, None) for name, code in SCALAR_TYPE_CODES.items()}
_CACHE_PREFIX = "metal.constant:"


def read_index(blob: memoryview, where: str) -> list[ConstantEntry]:
    try:
        return decode_index(blob)
    except ValueError as exc:
        raise InvalidProgramError(f"{where}: {exc}") from None


def _aligned_copy(data: memoryview) -> torch.Tensor:
    out = torch.empty(len(data) + ALIGNMENT, dtype=torch.uint8)
    skip = (-out.data_ptr()) % ALIGNMENT
    out = out[skip : skip + len(data)]
    out.numpy()[:] = np.frombuffer(data, dtype=np.uint8)
    return out


def _lend(data: memoryview) -> torch.Tensor:
    """The bytes as a uint8 tensor: in place when aligned, else one aligned copy."""
    arr = np.frombuffer(data, dtype=np.uint8)
    if arr.ctypes.data % ALIGNMENT:
        return _aligned_copy(data)
    with warnings.catch_warnings():  # read-only program bytes; the .so never writes them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


def _typed(raw: torch.Tensor, entry: ConstantEntry, where: str) -> torch.Tensor:
    dtype = _DTYPES.get(entry.dtype)
    if dtype is None:
        raise InvalidProgramError(f"{where}: constant {entry.name!r} has dtype code {entry.dtype}")
    item = torch.empty((), dtype=dtype).element_size()
    need = entry.offset + sum((s - 1) * st for s, st in zip(entry.shape, entry.stride)) + 1
    if 0 in entry.shape:
        need = 0
    if raw.numel() % item or need * item > raw.numel():
        raise InvalidProgramError(
            f"{where}: constant {entry.name!r} ({entry.fqn}): {raw.numel()} stored bytes do "
            f"not hold shape {list(entry.shape)} stride {list(entry.stride)} offset "
            f"{entry.offset} of {dtype}"
        )
    return raw.view(dtype).as_strided(entry.shape, entry.stride, entry.offset)


def load_constants(
    entries: list[ConstantEntry],
    named_blob: Callable[[str], memoryview],
    cache: dict[str, Any],
    where: str,
) -> dict[str, torch.Tensor]:
    """AOTI constant name -> tensor, for one delegate.

    ``named_blob(key)`` reads named data; ``cache`` is the program's shared dict: the
    checked bytes of each key and the shared mutable buffers live there.
    """
    out: dict[str, torch.Tensor] = {}
    for entry in entries:
        shared_key = _CACHE_PREFIX + entry.key
        raw = cache.get(shared_key)
        if raw is None:
            data = named_blob(entry.key)
            if len(data) != entry.nbytes:
                raise InvalidProgramError(
                    f"{where}: constant {entry.name!r} ({entry.fqn}) has {len(data)} bytes in "
                    f"named data {entry.key!r}, the index says {entry.nbytes}"
                )
            actual = hashlib.sha256(data).hexdigest()
            if actual != key_digest(entry.key):
                raise IntegrityError(
                    f"{where}: constant {entry.name!r} ({entry.fqn}) does not match its key: "
                    f"sha256 {actual}, key {entry.key!r}; the program was altered or "
                    "corrupted after export"
                )
            raw = _lend(data)
            cache[shared_key] = raw
        if entry.mutable:
            if entry.share:  # one writable copy per program, under the buffer's name
                mutable_key = f"{_CACHE_PREFIX}mutable:{entry.fqn}:{entry.key}"
                if mutable_key not in cache:
                    cache[mutable_key] = _aligned_copy(memoryview(raw.numpy()))
                raw = cache[mutable_key]
            else:  # this delegate's own buffer, as its method declares
                raw = _aligned_copy(memoryview(raw.numpy()))
        out[entry.name] = _typed(raw, entry, where)
    return out
