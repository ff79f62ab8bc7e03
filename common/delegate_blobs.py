"""The wire format of a Metal (AOTI) delegate, shared by the backend that writes it and the
runtime that reads it.

A compiled partition is two named-data entries, the ``.so`` and its weights, each keyed by
the hex sha256 of its bytes plus ``_so_blob`` / ``_weights_blob``. The delegate's processed
bytes are the two keys, one per line: the runtime finds the blobs by them and checks each
blob against the hash in its key. This is upstream's AOTI layout, so an ``mps`` program
runs on ExecuTorch's own Metal runtime unchanged.

A partition compiled for etmetal's runtime whose ``.so`` runs operators through the proxy
executor has a third entry, its extern-node table (``<sha256>_externs_blob``), named on
a third line. Programs without one (every program meant for upstream's runtime) keep the
two-line form.
"""

from __future__ import annotations

import hashlib

SO_SUFFIX = "_so_blob"
WEIGHTS_SUFFIX = "_weights_blob"
EXTERN_NODES_SUFFIX = "_externs_blob"
PROCESSED_FORMAT = (
    f"<sha256>{SO_SUFFIX}\\n<sha256>{WEIGHTS_SUFFIX}[\\n<sha256>{EXTERN_NODES_SUFFIX}]"
)
_HEX = frozenset("0123456789abcdef")


def blob_key(data: bytes | memoryview, suffix: str) -> str:
    """The named-data key of ``data``: its hex sha256 followed by ``suffix``."""
    return hashlib.sha256(data).hexdigest() + suffix


def key_digest(key: str) -> str:
    """The hex sha256 a blob key starts with ("" if the key has none)."""
    head = key.rsplit("_", 2)[0]
    return head if len(head) == 64 and set(head) <= _HEX else ""


def format_processed(so_key: str, weights_key: str, extern_nodes_key: str | None = None) -> bytes:
    """The processed bytes naming one partition's blobs (the table's only when it has one)."""
    keys = [so_key, weights_key] + ([extern_nodes_key] if extern_nodes_key else [])
    return "\n".join(keys).encode()


def _keys(processed: bytes | memoryview) -> list[str]:
    try:
        lines = bytes(processed).decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = []
    if (
        len(lines) not in (2, 3)
        or not lines[0].endswith(SO_SUFFIX)
        or not lines[1].endswith(WEIGHTS_SUFFIX)
        or (len(lines) == 3 and not lines[2].endswith(EXTERN_NODES_SUFFIX))
        or not all(key_digest(k) for k in lines)
    ):
        raise ValueError(
            f"processed bytes are not a Metal AOTI blob reference ('{PROCESSED_FORMAT}'): "
            f"{bytes(processed[:120])!r}"
        )
    return lines


def parse_processed(processed: bytes | memoryview) -> tuple[str, str]:
    """(so key, weights key) named by processed bytes; ValueError if they are not that."""
    lines = _keys(processed)
    return lines[0], lines[1]


def extern_nodes_key(processed: bytes | memoryview) -> str | None:
    """The key of the partition's extern-node table; None when it has none."""
    lines = _keys(processed)
    return lines[2] if len(lines) == 3 else None


# in the extern-node table, the node metadata key etmetal's compile writes (JSON: tensor
# name -> dtype name, e.g. "float32") and its proxy executor checks each tensor against
EXTERN_NODE_DTYPES_KEY = "etmetal_tensor_dtypes"
