"""Custom operators compiled as direct C-shim calls (``aot_inductor.custom_ops_to_c_shims``).

Without that option AOTInductor sends a non-ATen operator through libtorch's proxy
executor, which a ``.so`` built without libtorch cannot call. Upstream's Metal backend
maps torchao's int4 linear and ExecuTorch's ``metal::gather_qmv`` /
``metal::gated_delta_rule`` to named Metal shims; etmetal maps the same operators for
the target's device prefix (``cpu`` for ``host``), declared once in
:mod:`etmetal.common.custom_ops`. The option is only set for programs that use one of
them, so no other program's compile (or cache key) changes.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch

from etmetal.common.custom_ops import CUSTOM_OP_SHIMS, CustomOpShim

from .edge_ops import aten_overload

# modules whose import registers a namespace's operators
_REGISTRARS = {
    "metal": (
        "executorch.backends.apple.metal.ops.gather_qmv",
        "executorch.backends.apple.metal.ops.gated_delta_rule",
    ),
}


def _overload(shim: CustomOpShim) -> torch._ops.OpOverload | None:
    namespace, name = shim.qualname.split("::")
    if namespace == "torchao":
        from .torchao_ops import register

        register()
    for module in _REGISTRARS.get(namespace, ()):
        with contextlib.suppress(ImportError):  # an older ExecuTorch without the op
            importlib.import_module(module)
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


def custom_op_overloads() -> dict[torch._ops.OpOverload, CustomOpShim]:
    """Each registered custom operator the delegate runs -> its shim."""
    found = {}
    for shim in CUSTOM_OP_SHIMS:
        op = _overload(shim)
        if op is not None:
            found[op] = shim
    return found


def _used_ops(ep: torch.export.ExportedProgram) -> set[Any]:
    used = set()
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            used.add(aten_overload(node.target))
            # a mutating custom op appears wrapped: auto_functionalized(op, ...)
            if node.args and isinstance(aten_overload(node.args[0]), torch._ops.OpOverload):
                used.add(aten_overload(node.args[0]))
    return used


def inductor_custom_shims(
    ep: torch.export.ExportedProgram, device: str
) -> dict[torch._ops.OpOverload, list[str]]:
    """The ``custom_ops_to_c_shims`` entries ``ep`` needs on ``device`` (empty: none)."""
    used = _used_ops(ep)
    ours = custom_op_overloads()
    return {op: [shim.declaration(device)] for op, shim in ours.items() if op in used}
