"""Rewriting a delegated ``.pte``'s Metal blobs, for tests of what the delegate refuses."""

from __future__ import annotations

import hashlib

from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer


def metal_blobs(pte: bytes, delegate: int = 0) -> tuple[str, bytes, str, bytes]:
    """(so key, .so bytes, weights key, weights bytes) of one delegate of ``forward``."""
    parsed = deserialize_pte_binary(pte)
    program, named = parsed.program, parsed.named_data
    d = program.execution_plan[0].delegates[delegate]
    so_key, w_key = program.backend_delegate_data[d.processed.index].data.decode().split("\n")
    blob = lambda k: bytes(named.buffers[named.pte_data[k].buffer_index])  # noqa: E731
    return so_key, blob(so_key), w_key, blob(w_key)


def flip_byte(pte: bytes, blob: bytes, at: int | None = None) -> bytes:
    """``pte`` with one byte of ``blob`` (found in the file) changed; keys untouched."""
    start = pte.find(blob)
    assert start >= 0 and pte.find(blob, start + 1) < 0, "blob not found exactly once"
    pos = start + (len(blob) // 2 if at is None else at)
    return pte[:pos] + bytes([pte[pos] ^ 0x5A]) + pte[pos + 1 :]


def replace_blobs(pte: bytes, so: bytes | None = None, weights: bytes | None = None) -> bytes:
    """``pte`` with delegate 0's .so and/or weights replaced, keys rehashed consistently."""
    parsed = deserialize_pte_binary(pte)
    program, named = parsed.program, parsed.named_data
    d = program.execution_plan[0].delegates[0]
    processed = program.backend_delegate_data[d.processed.index]
    keys = processed.data.decode().split("\n")
    new_keys = []
    for key, new, suffix in zip(keys, (so, weights), ("_so_blob", "_weights_blob")):
        entry = named.pte_data.pop(key)
        if new is None:
            named.pte_data[key] = entry
            new_keys.append(key)
            continue
        named.buffers.append(new)
        new_key = hashlib.sha256(new).hexdigest() + suffix
        named.pte_data[new_key] = DataEntry(len(named.buffers) - 1, entry.alignment, None)
        new_keys.append(new_key)
    processed.data = "\n".join(new_keys).encode()
    return bytes(serialize_pte_binary(parsed, extract_delegate_segments=True))


def split_named_data(pte: bytes) -> tuple[bytes, bytes]:
    """(``.pte`` without named data, ``.ptd`` holding it): the external-data layout."""
    parsed = deserialize_pte_binary(pte)
    named = parsed.named_data
    payload = DataPayload(buffers=list(named.buffers), named_data=dict(named.pte_data))
    ptd = bytes(FlatTensorSerializer().serialize(payload))
    parsed.named_data = None
    return bytes(serialize_pte_binary(parsed, extract_delegate_segments=True)), ptd
