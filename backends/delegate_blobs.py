"""How a compiled partition is stored in a program: the blobs go into the program's named
data under their content keys, and the processed bytes name them (the format is
:mod:`etmetal.common.delegate_blobs`, which the runtime reads too). Content keys keep
several partitions of one method apart and let the runtime check each blob's integrity.
"""

from __future__ import annotations

from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput

from etmetal.common.delegate_blobs import (
    EXTERN_NODES_SUFFIX,
    SO_SUFFIX,
    WEIGHTS_SUFFIX,
    blob_key,
    format_processed,
)

ALIGNMENT = 1


def pack_delegate_blobs(
    so_bytes: bytes, weights_bytes: bytes, extern_nodes: bytes | None = None
) -> tuple[bytes, NamedDataStoreOutput]:
    """Processed bytes and named data for one compiled partition (``extern_nodes``: its
    extern-node table, for a ``.so`` that calls the proxy executor)."""
    so_key = blob_key(so_bytes, SO_SUFFIX)
    weights_key = blob_key(weights_bytes, WEIGHTS_SUFFIX)
    store = NamedDataStore()
    store.add_named_data(so_key, so_bytes, ALIGNMENT, None)
    store.add_named_data(weights_key, weights_bytes, ALIGNMENT, None)
    table_key = None
    if extern_nodes is not None:
        table_key = blob_key(extern_nodes, EXTERN_NODES_SUFFIX)
        store.add_named_data(table_key, extern_nodes, ALIGNMENT, None)
    return format_processed(so_key, weights_key, table_key), store.get_named_data_store_output()
