"""The shared-weights layout of a Metal (AOTI) delegate, read by the backend and the runtime.

Upstream's layout stores a partition's constants as one blob (``<sha256>_weights_blob``),
so two methods that read the same weights carry them twice unless the blobs happen to be
byte-identical. The shared layout stores every constant as its own named-data entry, keyed
by the hash of its bytes and its fully qualified name (``<sha256>_<fqn>_weight``), and
names them from a small index (``<sha256>_weights_index``, JSON) that takes the weights
blob's place on the second line of the processed bytes. Partitions of different methods
that hold the same tensor produce the same key, and the program keeps one copy.

The index lists the ``.so``'s non-folded constants in its own order, with what the runtime
needs to lend each one to the model container as a user-managed constant: the AOTI name,
the FQN, the c10 dtype code, sizes, strides, storage offset, the stored byte count, whether
the program mutates it (a KV cache) and whether the methods share it (``share``: only when
the program was lowered with ``share_mutable_buffers``; read-only constants are always
shared).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .delegate_blobs import INDEX_SUFFIX, key_digest

__all__ = ["INDEX_SUFFIX", "WEIGHT_SUFFIX", "ConstantEntry", "decode_index", "encode_index"]

WEIGHT_SUFFIX = "_weight"
FORMAT = "etmetal-weights-index/1"


@dataclass(frozen=True)
class ConstantEntry:
    name: str  # the AOTI constant name the .so looks it up by
    fqn: str  # the module's fully qualified name of the tensor
    dtype: int  # c10 scalar type code
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # storage offset, in elements
    nbytes: int  # bytes stored (AOTI's data_size: the storage, padded to 64)
    key: str  # named-data key of the bytes
    mutable: bool = False
    share: bool = True


def weight_key(digest: str, fqn: str) -> str:
    """Named-data key of one constant: the sha256 of its bytes, then its FQN."""
    return f"{digest}_{fqn}{WEIGHT_SUFFIX}"


def encode_index(entries: list[ConstantEntry]) -> bytes:
    """Deterministic bytes of an index (equal entries give equal bytes, hence equal keys)."""
    doc = {"format": FORMAT, "constants": [asdict(e) for e in entries]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"{what} must be a list of integers, got {value!r:.80}")
    return tuple(value)


def _entry(i: int, raw: object) -> ConstantEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"constant {i} is a {type(raw).__name__}, not an object")
    fields = {"name", "fqn", "dtype", "shape", "stride", "offset", "nbytes", "key"}
    missing = fields - raw.keys()
    if missing:
        raise ValueError(f"constant {i} lacks {sorted(missing)}")
    name = raw["name"]
    for field in ("name", "fqn", "key"):
        if not isinstance(raw[field], str) or not raw[field]:
            raise ValueError(f"constant {i} ({name!r}): {field} must be a non-empty string")
    for field in ("dtype", "offset", "nbytes"):
        value = raw[field]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"constant {i} ({name!r}): {field} must be an integer >= 0")
    shape = _ints(raw["shape"], f"constant {i} ({name!r}) shape")
    stride = _ints(raw["stride"], f"constant {i} ({name!r}) stride")
    if len(shape) != len(stride) or any(s < 0 for s in shape + stride):
        raise ValueError(
            f"constant {i} ({name!r}): shape {list(shape)} and stride {list(stride)} "
            "must be non-negative and of one rank"
        )
    key = raw["key"]
    if not key.endswith(WEIGHT_SUFFIX) or not key_digest(key):
        raise ValueError(f"constant {i} ({name!r}): key {key!r} is not '<sha256>_<fqn>_weight'")
    return ConstantEntry(
        name=name,
        fqn=raw["fqn"],
        dtype=raw["dtype"],
        shape=shape,
        stride=stride,
        offset=raw["offset"],
        nbytes=raw["nbytes"],
        key=key,
        mutable=bool(raw.get("mutable", False)),
        share=bool(raw.get("share", True)),
    )


def decode_index(data: bytes | memoryview) -> list[ConstantEntry]:
    """The entries of an index; ValueError naming what is wrong if it is not one."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"weights index is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"weights index has format {found!r}, expected {FORMAT!r}")
    raw = doc.get("constants")
    if not isinstance(raw, list):
        raise ValueError("weights index has no 'constants' list")
    entries = [_entry(i, r) for i, r in enumerate(raw)]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"weights index names a constant twice: {sorted(names)}")
    return entries
