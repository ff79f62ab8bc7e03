"""Read and rewrite the Metal delegate entries of a serialized ``.pte``, for tests and the
fuzz campaign: which layout a delegate's constants use, the bytes the ``.so`` reads, and
consistent rehashing after a change.

Written from the format's description (:mod:`etmetal.common.delegate_blobs`) against
exir's own deserializer, not through the runtime's reader, so a test that uses it
checks the runtime instead of repeating it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.exir._serialize.data_serializer import DataEntry

ONE_BLOB, SHARED = "one_blob", "shared"


@dataclass
class DelegateData:
    """One delegate of a plan: its id, processed bytes (the key lines) and the named data
    they reach."""

    id: str
    processed: bytes
    keys: list[str]
    so: bytes
    weights: bytes  # the weights blob, or the weights index (JSON)
    constants: dict[str, bytes]  # shared layout: key -> bytes, in the index's order

    @property
    def layout(self) -> str:
        return SHARED if self.keys[1].endswith("_weights_index") else ONE_BLOB

    @property
    def extern_nodes_key(self) -> str | None:
        return self.keys[2] if len(self.keys) > 2 else None

    @property
    def index(self) -> list[dict]:
        return json.loads(self.weights)["constants"] if self.layout == SHARED else []

    def aoti_blob(self) -> bytes:
        """The constants as one blob in the ``.so``'s order: what AOTI wrote next to it
        (the shared layout cuts that blob along the constant table, so the pieces
        concatenated in index order give it back)."""
        return b"".join(self.constants.values()) if self.layout == SHARED else self.weights


def named_bytes(pte: bytes) -> dict[str, bytes]:
    named = deserialize_pte_binary(pte).named_data
    if named is None:
        return {}
    return {k: bytes(named.buffers[e.buffer_index]) for k, e in named.pte_data.items()}


def metal_delegates(pte: bytes, plan: int = 0) -> list[DelegateData]:
    """The delegates of execution plan ``plan`` with the named data they name."""
    parsed = deserialize_pte_binary(pte)
    program, named = parsed.program, parsed.named_data

    def blob(key: str) -> bytes:
        return bytes(named.buffers[named.pte_data[key].buffer_index])

    out = []
    for d in program.execution_plan[plan].delegates:
        processed = bytes(program.backend_delegate_data[d.processed.index].data)
        keys = processed.decode().split("\n")
        weights = blob(keys[1])
        constants = {}
        if keys[1].endswith("_weights_index"):
            constants = {c["key"]: blob(c["key"]) for c in json.loads(weights)["constants"]}
        out.append(DelegateData(d.id, processed, keys, blob(keys[0]), weights, constants))
    return out


def replace_named(pte: bytes, changes: dict[str, bytes]) -> bytes:
    """``pte`` with the named-data entries ``changes`` names (old key -> new bytes) replaced
    and every key rehashed consistently: a changed constant gets a new key in every index
    that names it, a changed index a new key in the processed bytes. The result passes
    the integrity checks, so what it tests is the next check."""
    parsed = deserialize_pte_binary(pte)
    named = parsed.named_data
    renamed: dict[str, str] = {}

    def put(old: str, data: bytes) -> None:
        entry = named.pte_data.pop(old)
        named.buffers.append(data)
        new = hashlib.sha256(data).hexdigest() + old[64:]
        named.pte_data[new] = DataEntry(len(named.buffers) - 1, entry.alignment, None)
        renamed[old] = new

    indexes = [k for k in named.pte_data if k.endswith("_weights_index")]
    for old, data in changes.items():
        put(old, data)
    for key in indexes:  # indexes naming a renamed constant are rewritten, then rehashed
        key = renamed.get(key, key)
        # bytes, not text: a mutated index need not be UTF-8
        text = bytes(named.buffers[named.pte_data[key].buffer_index])
        new_text = text
        for old, new in renamed.items():
            new_text = new_text.replace(old.encode(), new.encode())
        if new_text != text:
            put(key, new_text)
            for old, new in list(renamed.items()):  # chain: original index key -> newest
                if new == key:
                    renamed[old] = renamed[key]
    for inline in parsed.program.backend_delegate_data:
        data = bytes(inline.data)
        for old, new in renamed.items():
            data = data.replace(old.encode(), new.encode())
        inline.data = data
    return bytes(serialize_pte_binary(parsed, extract_delegate_segments=True))
