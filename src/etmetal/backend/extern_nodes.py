"""The extern-node table of a compiled partition: what its ``.so``'s proxy executor calls run.

AOTInductor serializes every operator it leaves to ATen without a C shim (custom ops,
ATen ops missing from torch's C-shim ABI) into a JSON table written next to the wrapper
(``<wrapper>.json``); the ``.so`` calls ``aoti_torch_proxy_executor_call_function`` with
an index into it. etmetal's proxy executor (``shims/proxy_executor.py``) needs the table
at run time, so it travels with the ``.so`` in the program's named data.

The table names tensors only by Inductor's buffer names, so a runtime cannot tell a
tensor of the wrong dtype from a right one. While etmetal compiles, each node's metadata
gets the dtype of every tensor it passes (:data:`DTYPES_METADATA_KEY`, read from the
graph being compiled); readers that do not know the key (torch's own proxy executor)
ignore it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from etmetal.common.delegate_blobs import EXTERN_NODE_DTYPES_KEY as DTYPES_METADATA_KEY
from etmetal.common.fallback_table import PROXY_EXECUTOR_SHIM

log = logging.getLogger(__name__)

__all__ = ["DTYPES_METADATA_KEY", "PROXY_EXECUTOR_SHIM", "annotate_dtypes", "find_extern_nodes"]


def find_extern_nodes(paths: list[str]) -> str | None:
    """The extern-node table among the files ``aot_compile`` returned (None: no extern node)."""
    return next((p for p in paths if p.endswith(".wrapper.json")), None)


def _tensor_names(arg: dict[str, Any]) -> list[str]:
    ((key, value),) = arg.items()
    if key == "as_tensor":
        return [value["name"]]
    if key == "as_tensors":
        return [v["name"] for v in value]
    if key in ("as_optional_tensors",):
        return [v["as_tensor"]["name"] for v in value if "as_tensor" in v]
    if key == "as_optional_tensor":
        return _tensor_names(value)
    return []


def annotate_dtypes(text: str, dtype_of) -> str:
    """``text`` (a serialized table) with each node's tensor dtypes in its metadata;
    ``dtype_of(name)`` gives a buffer's ``torch.dtype`` (KeyError: unknown, left out)."""
    data = json.loads(text)
    for entry in data.get("nodes", []):
        node = entry["node"]
        names = [n for a in node["inputs"] for n in _tensor_names(a["arg"])]
        names += [n for o in node["outputs"] for n in _tensor_names(o)]
        dtypes = {}
        for name in names:
            try:
                dtypes[name] = str(dtype_of(name)).removeprefix("torch.")
            except (KeyError, AttributeError, AssertionError, NotImplementedError):
                log.debug("extern node %s: no dtype for tensor %s", node["target"], name)
        node["metadata"] = {**(node.get("metadata") or {}), DTYPES_METADATA_KEY: json.dumps(dtypes)}
    return json.dumps(data)


@contextmanager
def dtype_annotated_tables() -> Iterator[None]:
    """While active, Inductor's extern-node tables carry each tensor's dtype (see module doc).

    Inductor picks its serializer when a graph is created, so the patch covers the compiles
    started inside the block; it is undone even when the compile fails.
    """
    import torch._inductor.extern_node_serializer as serializer_module
    from torch._inductor.virtualized import V

    original = serializer_module.extern_node_json_serializer

    def serialize(nodes):
        text = original(nodes)
        try:
            return annotate_dtypes(text, V.graph.get_dtype)
        except Exception as exc:  # the plain table still runs; only the dtype check is lost
            log.warning("extern-node table left without dtypes: %s", exc)
            return text

    serializer_module.extern_node_json_serializer = serialize
    try:
        yield
    finally:
        serializer_module.extern_node_json_serializer = original


def read_table(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None and path.exists() else None
