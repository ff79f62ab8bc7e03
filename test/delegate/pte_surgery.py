"""Rewriting a delegated ``.pte``'s Metal blobs, for tests of what the delegate refuses."""

from __future__ import annotations

from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.exir._serialize.data_serializer import DataPayload
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

from etmetal.testing.pte_blobs import metal_delegates, replace_named


def metal_blobs(pte: bytes, delegate: int = 0) -> tuple[str, bytes, str, bytes]:
    """(so key, .so bytes, weights key, weights bytes) of one delegate of ``forward``; the
    weights entry is the blob (upstream's layout) or the index (the shared layout)."""
    d = metal_delegates(pte)[delegate]
    return d.keys[0], d.so, d.keys[1], d.weights


def flip_byte(pte: bytes, blob: bytes, at: int | None = None) -> bytes:
    """``pte`` with one byte of ``blob`` (found in the file) changed; keys untouched."""
    start = pte.find(blob)
    assert start >= 0 and pte.find(blob, start + 1) < 0, "blob not found exactly once"
    pos = start + (len(blob) // 2 if at is None else at)
    return pte[:pos] + bytes([pte[pos] ^ 0x5A]) + pte[pos + 1 :]


def replace_blobs(pte: bytes, so: bytes | None = None, weights: bytes | None = None) -> bytes:
    """``pte`` with delegate 0's .so and/or weights entry replaced, keys rehashed
    consistently (``weights`` replaces the blob or the index, whichever the delegate has)."""
    keys = metal_delegates(pte)[0].keys
    changes = {k: v for k, v in zip(keys, (so, weights)) if v is not None}
    return replace_named(pte, changes)


def split_named_data(pte: bytes) -> tuple[bytes, bytes]:
    """(``.pte`` without named data, ``.ptd`` holding it): the external-data layout."""
    parsed = deserialize_pte_binary(pte)
    named = parsed.named_data
    payload = DataPayload(buffers=list(named.buffers), named_data=dict(named.pte_data))
    ptd = bytes(FlatTensorSerializer().serialize(payload))
    parsed.named_data = None
    return bytes(serialize_pte_binary(parsed, extract_delegate_segments=True)), ptd
