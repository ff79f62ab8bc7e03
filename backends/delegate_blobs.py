"""How a compiled partition is stored in a program: upstream's AOTI layout.

The ``.so`` and the weights blob go into the program's named data, each under the
hex sha256 of its bytes plus ``_so_blob`` / ``_weights_blob``. The delegate's
processed bytes are the two keys, one per line (the runtime cannot recompute them
without the data). Content keys keep several partitions of one method apart and
let the runtime check each blob's integrity. ExecuTorch's Metal runtime reads the
same layout, so an ``mps`` program runs on it unchanged.
"""

from __future__ import annotations

import hashlib

from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput

SO_SUFFIX = "_so_blob"
WEIGHTS_SUFFIX = "_weights_blob"
ALIGNMENT = 1


def blob_key(data: bytes, suffix: str) -> str:
    return hashlib.sha256(data).hexdigest() + suffix


def pack_delegate_blobs(
    so_bytes: bytes, weights_bytes: bytes
) -> tuple[bytes, NamedDataStoreOutput]:
    """Processed bytes and named data for one compiled partition."""
    so_key = blob_key(so_bytes, SO_SUFFIX)
    weights_key = blob_key(weights_bytes, WEIGHTS_SUFFIX)
    store = NamedDataStore()
    store.add_named_data(so_key, so_bytes, ALIGNMENT, None)
    store.add_named_data(weights_key, weights_bytes, ALIGNMENT, None)
    processed = f"{so_key}\n{weights_key}".encode()
    return processed, store.get_named_data_store_output()


def unpack_processed_bytes(processed: bytes) -> tuple[str, str]:
    """The (so key, weights key) a delegate's processed bytes name."""
    lines = processed.decode("utf-8").split("\n")
    if len(lines) != 2 or not lines[0].endswith(SO_SUFFIX) or not lines[1].endswith(WEIGHTS_SUFFIX):
        raise ValueError(f"not Metal AOTI processed bytes: {processed[:120]!r}")
    return lines[0], lines[1]
