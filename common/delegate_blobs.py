"""The wire format of a Metal (AOTI) delegate, shared by the backend that writes it and the
runtime that reads it.

A compiled partition is two named-data entries, the ``.so`` and its weights, each keyed by
the hex sha256 of its bytes plus ``_so_blob`` / ``_weights_blob``. The delegate's processed
bytes are the two keys, one per line: the runtime finds the blobs by them and checks each
blob against the hash in its key. This is upstream's AOTI layout, so an ``mps`` program
runs on ExecuTorch's own Metal runtime unchanged.
"""

from __future__ import annotations

import hashlib

SO_SUFFIX = "_so_blob"
WEIGHTS_SUFFIX = "_weights_blob"
INDEX_SUFFIX = "_weights_index"
PROCESSED_FORMAT = f"<sha256>{SO_SUFFIX}\\n<sha256>{WEIGHTS_SUFFIX} (or {INDEX_SUFFIX})"
_HEX = frozenset("0123456789abcdef")


def blob_key(data: bytes | memoryview, suffix: str) -> str:
    """The named-data key of ``data``: its hex sha256 followed by ``suffix``."""
    return hashlib.sha256(data).hexdigest() + suffix


def key_digest(key: str) -> str:
    """The hex sha256 a blob key starts with ("" if the key has none)."""
    head = key[:64]
    ok = len(key) > 64 and key[64] == "_" and set(head) <= _HEX
    return head if ok else ""


def format_processed(so_key: str, weights_key: str) -> bytes:
    """The processed bytes naming one partition's two blobs."""
    return f"{so_key}\n{weights_key}".encode()


def parse_processed(processed: bytes | memoryview) -> tuple[str, str]:
    """(so key, weights key) named by processed bytes; ValueError if they are not that."""
    try:
        lines = bytes(processed).decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = []
    if (
        len(lines) != 2
        or not lines[0].endswith(SO_SUFFIX)
        or not lines[1].endswith((WEIGHTS_SUFFIX, INDEX_SUFFIX))
        or not all(key_digest(k) for k in lines)
    ):
        raise ValueError(
            f"processed bytes are not a Metal AOTI blob reference ('{PROCESSED_FORMAT}'): "
            f"{bytes(processed[:120])!r}"
        )
    return lines[0], lines[1]
