"""Give elementwise arithmetic its Python-scalar operands back before Inductor sees it.

``to_edge`` turns every scalar operand into a 0-dim tensor constant
(``x * 0.125`` becomes ``mul.Tensor(x, _lifted_tensor_constant0)``), which a delegate
partition receives as a buffer. The result is the same, but Inductor's pattern
matchers look for the scalar form: attention written as ``softmax(q @ k.T * scale) @ v``
is fused into one scaled-dot-product-attention call only when ``scale`` is a number.
A constant goes back to being a number only where that cannot change the result's
dtype: both operands floating point, or both integral.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from etmetal.backend.edge_ops import aten_overload

aten = torch.ops.aten

_ARITHMETIC = {aten.mul.Tensor, aten.div.Tensor, aten.add.Tensor, aten.sub.Tensor}
_COMMUTATIVE = {aten.mul.Tensor, aten.add.Tensor}


def _scalar_constants(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholder name -> value of each 0-dim constant the program never writes."""
    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    found = {}
    for spec in sig.input_specs:
        if spec.kind == InputKind.CONSTANT_TENSOR:
            value = ep.constants.get(spec.target)
        elif spec.kind == InputKind.BUFFER and spec.arg.name not in mutated:
            value = ep.state_dict.get(spec.target, ep.constants.get(spec.target))
        else:
            continue
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex():
            found[spec.arg.name] = value
    return found


def _same_category(a: torch.dtype, b: torch.dtype) -> bool:
    return (a.is_floating_point and b.is_floating_point) or (
        not a.is_floating_point and not b.is_floating_point and torch.bool not in (a, b)
    )


def _tensor_dtype(arg: Any) -> torch.dtype | None:
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) and val.dim() > 0 else None


class InlineScalarConstantsPass(PassBase):
    """Over the graph module of ``exported_program`` (whose signature says which
    placeholders are 0-dim constants never written); ``replaced`` counts the operands
    that became numbers."""

    def __init__(self, exported_program: ExportedProgram) -> None:
        super().__init__()
        self.exported_program = exported_program
        self.replaced = 0

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        if graph_module is not self.exported_program.graph_module:
            # the placeholders' meaning comes from the program's signature: another graph's
            # placeholders of the same name are other values
            raise ValueError(
                "InlineScalarConstantsPass runs on the graph module of the ExportedProgram "
                "it was made with"
            )
        replaced = _inline(self.exported_program)
        self.replaced += replaced
        return PassResult(graph_module, replaced > 0)


def _inline(ep: ExportedProgram) -> int:
    constants = _scalar_constants(ep)
    if not constants:
        return 0
    replaced = 0
    for node in ep.graph.nodes:
        if node.op != "call_function" or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
            continue
        op = aten_overload(node.target)
        if op not in _ARITHMETIC:
            continue
        a, b = node.args
        if op in _COMMUTATIVE and isinstance(a, fx.Node) and a.name in constants:
            a, b = b, a  # the constant goes second, as in ``x * 0.125``
        if not (isinstance(b, fx.Node) and b.op == "placeholder" and b.name in constants):
            continue
        value, other = constants[b.name], _tensor_dtype(a)
        if other is None or not _same_category(other, value.dtype):
            continue
        node.args = (a, value.item())
        replaced += 1
    if replaced:
        ep.graph.lint()
        ep.graph_module.recompile()
    return replaced
