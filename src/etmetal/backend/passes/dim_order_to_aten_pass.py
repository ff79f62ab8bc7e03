"""Rewrite ExecuTorch's dim-order operators to the ATen ones Inductor lowers.

``to_edge`` replaces ``_to_copy``/``clone`` by ``dim_order_ops._to_dim_order_copy``
and ``_clone_dim_order``, which carry the layout as a dim order. Inductor knows
nothing of them, so inside a delegate they become ``aten._to_copy``/``aten.clone``
with the equivalent memory format.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from etmetal.backend.edge_ops import aten_overload

aten = torch.ops.aten


def memory_format_of(dim_order: Any, rank: int) -> torch.memory_format | None:
    """The memory format a dim order denotes, or None if no memory format does."""
    if dim_order is None:
        return torch.preserve_format
    order = [int(d) for d in dim_order]
    if order == list(range(rank)):
        return torch.contiguous_format
    if rank == 4 and order == [0, 2, 3, 1]:
        return torch.channels_last
    if rank == 5 and order == [0, 2, 3, 4, 1]:
        return torch.channels_last_3d
    return None


def _aten_form(node: fx.Node) -> Any:
    op = aten_overload(node.target)
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "dim_order_ops":
        return None
    name = op.__name__.split(".")[0]
    return {
        "_to_dim_order_copy": aten._to_copy.default,
        "_clone_dim_order": aten.clone.default,
    }.get(name)


def convertible(node: fx.Node) -> bool:
    """Can this dim-order node be expressed with a memory format?"""
    if _aten_form(node) is None:
        return False
    val = node.meta.get("val")
    rank = val.dim() if isinstance(val, torch.Tensor) else 0
    return memory_format_of(node.kwargs.get("dim_order"), rank) is not None


class DimOrderToAtenPass(PassBase):
    """Rewrite every convertible dim-order node in place; ``rewritten`` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.rewritten = 0

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        changed = _rewrite(graph_module)
        self.rewritten += changed
        return PassResult(graph_module, changed > 0)


def _rewrite(gm: fx.GraphModule) -> int:
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not convertible(node):
            continue
        target = _aten_form(node)
        val = node.meta.get("val")
        kwargs = dict(node.kwargs)
        fmt = memory_format_of(kwargs.pop("dim_order", None), val.dim())
        kwargs["memory_format"] = fmt
        if target is aten.clone.default:
            kwargs = {"memory_format": fmt}
        node.target = target
        node.kwargs = kwargs
        changed += 1
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
