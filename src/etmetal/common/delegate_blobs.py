"""The wire format of a Metal (AOTI) delegate, shared by the backend that writes it and the
runtime that reads it.

A delegate's processed bytes are named-data keys, one per line, each the hex sha256 of
the entry's bytes followed by a suffix naming what it is; the runtime finds the entries by
them and checks each one against the hash in its key:

1. ``<sha256>_so_blob``: the compiled ``.so``.
2. the partition's constants, in one of two layouts:
   - ``<sha256>_weights_blob``: upstream's layout, every constant in one blob the ``.so``
     reads as AOTI wrote it. Programs for ExecuTorch's own Metal runtime always use it, so
     an ``mps`` program runs there unchanged.
   - ``<sha256>_weights_index``: the shared-weights layout (:mod:`.weights_index`), an
     index naming one entry per constant, so partitions of different methods that hold the
     same tensor share one entry. Only etmetal's runtime reads it.
3. optional, ``<sha256>_externs_blob``: the extern-node table of a ``.so`` that runs
   operators without a C shim through etmetal's proxy executor.

Both extensions are optional and independent: a two-line ``so``/``weights_blob`` program
(upstream's, or any program etmetal wrote before them) still loads.

The *delegate digest* (:func:`delegate_digest`) is what a user trusts: one sha256 over the
processed bytes and the compile specs, i.e. over everything a delegate's init receives.
Since every entry the processed bytes name is checked against the hash in its key
before use (and a weights index names each constant by its hash), it pins the ``.so``,
the weights, the extern-node table and the target together.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SO_SUFFIX = "_so_blob"
WEIGHTS_SUFFIX = "_weights_blob"
INDEX_SUFFIX = "_weights_index"
EXTERN_NODES_SUFFIX = "_externs_blob"
PROCESSED_FORMAT = (
    f"<sha256>{SO_SUFFIX}\\n<sha256>{WEIGHTS_SUFFIX} (or {INDEX_SUFFIX})"
    f"[\\n<sha256>{EXTERN_NODES_SUFFIX}]"
)
_HEX = frozenset("0123456789abcdef")


_DIGEST_DOMAIN = b"etmetal MetalBackend delegate v1\0"


def delegate_digest(
    processed: bytes | memoryview, compile_specs: list[tuple[str, bytes]] | tuple = ()
) -> str:
    """The hex sha256 a user trusts for one delegate: over its processed bytes and its
    compile specs (in program order), each length-prefixed so no two inputs collide."""
    h = hashlib.sha256(_DIGEST_DOMAIN)

    def put(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    put(bytes(processed))
    for key, value in compile_specs:
        put(str(key).encode("utf-8", "surrogatepass"))
        put(bytes(value))
    return h.hexdigest()


def blob_key(data: bytes | memoryview, suffix: str) -> str:
    """The named-data key of ``data``: its hex sha256 followed by ``suffix``."""
    return hashlib.sha256(data).hexdigest() + suffix


def key_digest(key: str) -> str:
    """The hex sha256 a blob key starts with ("" if the key has none). The rest of the
    key is free (a shared constant's key carries its FQN, which may hold underscores)."""
    head = key[:64]
    ok = len(key) > 64 and key[64] == "_" and set(head) <= _HEX
    return head if ok else ""


@dataclass(frozen=True)
class DelegateKeys:
    """The named-data keys one delegate's processed bytes name."""

    so: str
    weights: str  # a ``_weights_blob`` or a ``_weights_index``
    extern_nodes: str | None = None

    @property
    def shared_weights(self) -> bool:
        """True when ``weights`` names an index of per-constant entries, not one blob."""
        return self.weights.endswith(INDEX_SUFFIX)


def format_processed(so_key: str, weights_key: str, extern_nodes_key: str | None = None) -> bytes:
    """The processed bytes naming one partition's entries (the table's only when it has one)."""
    keys = [so_key, weights_key] + ([extern_nodes_key] if extern_nodes_key else [])
    return "\n".join(keys).encode()


def parse_keys(processed: bytes | memoryview) -> DelegateKeys:
    """The keys named by processed bytes; ValueError if they are not a Metal delegate's."""
    try:
        lines = bytes(processed).decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = []
    if (
        len(lines) not in (2, 3)
        or not lines[0].endswith(SO_SUFFIX)
        or not lines[1].endswith((WEIGHTS_SUFFIX, INDEX_SUFFIX))
        or (len(lines) == 3 and not lines[2].endswith(EXTERN_NODES_SUFFIX))
        or not all(key_digest(k) for k in lines)
    ):
        raise ValueError(
            f"processed bytes are not a Metal AOTI blob reference ('{PROCESSED_FORMAT}'): "
            f"{bytes(processed[:120])!r}"
        )
    return DelegateKeys(lines[0], lines[1], lines[2] if len(lines) == 3 else None)


def parse_processed(processed: bytes | memoryview) -> tuple[str, str]:
    """(so key, weights key) named by processed bytes; ValueError if they are not that."""
    keys = parse_keys(processed)
    return keys.so, keys.weights


def extern_nodes_key(processed: bytes | memoryview) -> str | None:
    """The key of the partition's extern-node table; None when it has none."""
    return parse_keys(processed).extern_nodes


# in the extern-node table, the node metadata key etmetal's compile writes (JSON: tensor
# name -> dtype name, e.g. "float32") and its proxy executor checks each tensor against
EXTERN_NODE_DTYPES_KEY = "etmetal_tensor_dtypes"
