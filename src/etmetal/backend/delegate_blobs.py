"""How a compiled partition is stored in a program: the blobs go into the program's named
data under their content keys, and the processed bytes name them (the format is
:mod:`etmetal.common.delegate_blobs`, which the runtime reads too). Content keys keep
several partitions of one method apart and let the runtime check each blob's integrity.
"""

from __future__ import annotations

from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput

from etmetal.common.delegate_blobs import (
    EXTERN_NODES_SUFFIX,
    INDEX_SUFFIX,
    SO_SUFFIX,
    WEIGHTS_SUFFIX,
    blob_key,
    format_processed,
)
from etmetal.common.weights_index import encode_index

from .weights_split import SplitWeights

ALIGNMENT = 1
# a shared constant is lent to the .so in place; AOTI aligns its own constants to 64
WEIGHT_ALIGNMENT = 64


def pack_delegate_blobs(
    so_bytes: bytes,
    weights_bytes: bytes,
    extern_nodes: bytes | None = None,
    split: SplitWeights | None = None,
) -> tuple[bytes, NamedDataStoreOutput]:
    """Processed bytes and named data for one compiled partition.

    Without ``split`` the constants are ``weights_bytes``, one blob (upstream's layout).
    With it (the shared-weights layout) they are an index and one entry per constant;
    equal keys across methods are stored once when exir merges the methods' named data.
    ``extern_nodes``: the extern-node table of a ``.so`` that calls the proxy executor.
    """
    store = NamedDataStore()
    so_key = blob_key(so_bytes, SO_SUFFIX)
    store.add_named_data(so_key, so_bytes, ALIGNMENT, None)
    if split is None:
        weights_key = blob_key(weights_bytes, WEIGHTS_SUFFIX)
        store.add_named_data(weights_key, weights_bytes, ALIGNMENT, None)
    else:
        index = encode_index(split.entries)
        weights_key = blob_key(index, INDEX_SUFFIX)
        store.add_named_data(weights_key, index, ALIGNMENT, None)
        for key, piece in split.pieces.items():
            store.add_named_data(key, piece, WEIGHT_ALIGNMENT, None)
    table_key = None
    if extern_nodes is not None:
        table_key = blob_key(extern_nodes, EXTERN_NODES_SUFFIX)
        store.add_named_data(table_key, extern_nodes, ALIGNMENT, None)
    return format_processed(so_key, weights_key, table_key), store.get_named_data_store_output()
