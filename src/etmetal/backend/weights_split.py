"""Split a compiled partition's weights blob into one named-data entry per constant.

AOTInductor writes a partition's non-folded constants back to back into one blob, each
padded to its ``data_size``, in the order of the ``.so``'s constant table. That table is
generated code in the wrapper ``.cpp`` (``constants_info_[i].name = ...``); this module
reads it, cuts the blob along it and describes each piece in a weights index
(:mod:`etmetal.common.weights_index`). Anything unexpected (a field it cannot read, sizes
that do not add up to the blob) returns None and the caller keeps upstream's one-blob
layout: the split is an optimization, never a reason to fail a lowering.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass

from etmetal.common.scalar_types import SCALAR_TYPE_CODES
from etmetal.common.weights_index import ConstantEntry, weight_key

log = logging.getLogger(__name__)

_FIELD = re.compile(r"^\s*constants_info_\[(\d+)\]\.(\w+)\s*=\s*(.*);\s*$", re.M)
_DTYPE = re.compile(r"^cached_torch_dtype_(\w+)$")


@dataclass(frozen=True)
class SplitWeights:
    entries: list[ConstantEntry]
    pieces: dict[str, bytes]  # named-data key -> bytes


def _int_list(text: str) -> tuple[int, ...]:
    inner = text.strip()
    if not (inner.startswith("{") and inner.endswith("}")):
        raise ValueError(f"not a brace list: {text!r}")
    body = inner[1:-1].strip()
    return tuple(int(v) for v in body.split(",")) if body else ()


def _string(text: str) -> str:
    text = text.strip()
    if not (text.startswith('"') and text.endswith('"')) or "\\" in text:
        raise ValueError(f"not a plain string literal: {text!r}")
    return text[1:-1]


def constant_table(wrapper_cpp: str) -> list[dict[str, object]]:
    """The ``.so``'s constant table as the wrapper writes it, in index order."""
    rows: dict[int, dict[str, str]] = {}
    for match in _FIELD.finditer(wrapper_cpp):
        rows.setdefault(int(match.group(1)), {})[match.group(2)] = match.group(3)
    if sorted(rows) != list(range(len(rows))):
        raise ValueError(f"constant indices are not 0..n-1: {sorted(rows)[:8]}")
    table = []
    for i in range(len(rows)):
        row = rows[i]
        dtype = _DTYPE.match(row["dtype"].strip())
        if dtype is None or dtype.group(1) not in SCALAR_TYPE_CODES:
            raise ValueError(f"constant {i}: dtype {row['dtype']!r}")
        table.append(
            {
                "name": _string(row["name"]),
                "fqn": _string(row["original_fqn"]),
                "dtype": SCALAR_TYPE_CODES[dtype.group(1)],
                "offset": int(row["offset"]),
                "nbytes": int(row["data_size"]),
                "folded": row["from_folded"].strip() == "true",
                "shape": _int_list(row["shape"]),
                "stride": _int_list(row["stride"]),
                "opaque": "opaque_metadata" in row,
            }
        )
    return table


def split_weights(
    wrapper_cpp: str, blob: bytes, mutated: set[str], share_mutable: bool
) -> SplitWeights | None:
    """Cut ``blob`` into its constants; None when the wrapper's table cannot be trusted.

    ``mutated``: FQNs of the buffers the partition writes (its KV caches); they are
    marked mutable and shared between methods only when ``share_mutable``.
    """
    try:
        table = constant_table(wrapper_cpp)
    except (KeyError, ValueError) as exc:
        log.info("weights stay one blob: cannot read the constant table (%s)", exc)
        return None
    stored = [row for row in table if not row["folded"]]
    if any(row["opaque"] for row in stored):
        log.info("weights stay one blob: a constant carries opaque (mkldnn) metadata")
        return None
    total = sum(int(row["nbytes"]) for row in stored)
    if total != len(blob):
        log.info("weights stay one blob: table says %d bytes, blob has %d", total, len(blob))
        return None
    entries, pieces, at = [], {}, 0
    for row in stored:
        n = int(row["nbytes"])
        piece = blob[at : at + n]
        at += n
        fqn = str(row["fqn"]) or str(row["name"])
        key = weight_key(hashlib.sha256(piece).hexdigest(), fqn)
        pieces[key] = piece
        mutable = fqn in mutated
        entries.append(
            ConstantEntry(
                name=str(row["name"]),
                fqn=fqn,
                dtype=int(row["dtype"]),
                shape=tuple(row["shape"]),  # type: ignore[arg-type]
                stride=tuple(row["stride"]),  # type: ignore[arg-type]
                offset=int(row["offset"]),
                nbytes=n,
                key=key,
                mutable=mutable,
                share=share_mutable or not mutable,
            )
        )
    return SplitWeights(entries, pieces)
