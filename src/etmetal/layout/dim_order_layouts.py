"""Dim-order vocabulary and node builders for the layout legalization: the two layouts
the stock portable kernels know (default and channels-last), how a TensorSpec is moved to
one, and the ``_to_dim_order_copy`` / ``view_copy`` nodes that convert a tensor, with the
fake value and TensorSpec memory planning and the emitter read."""

from __future__ import annotations

from typing import Any

import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  (registers dim_order_ops)
import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.tensor import TensorSpec, stride_from_dim_order

TO_DIM_ORDER = exir_ops.edge.dim_order_ops._to_dim_order_copy.default
VIEW_COPY = exir_ops.edge.aten.view_copy.default
CONTIGUOUS, CHANNELS_LAST = "contiguous", "channels_last"


def layout_of(dim_order: Any) -> str | None:
    """``CONTIGUOUS``, ``CHANNELS_LAST`` or None (any other dim order)."""
    order = tuple(int(d) for d in dim_order)
    if order == tuple(range(len(order))):
        return CONTIGUOUS
    if order in ((0, 2, 3, 1), (0, 2, 3, 4, 1)):
        return CHANNELS_LAST
    return None


def dim_order_of(layout: str, rank: int) -> tuple[int, ...]:
    if layout == CONTIGUOUS:
        return tuple(range(rank))
    return (0, *range(2, rank), 1)


def can_be(layout: str, rank: int) -> bool:
    """Can a tensor of this rank carry the layout's label?"""
    return layout == CONTIGUOUS or rank in (4, 5)


def _is_one(size: Any) -> bool:
    return isinstance(size, int) and size == 1


def same_memory(shape: Any, order_a: Any, order_b: Any) -> bool:
    """Do two dim orders lay out a dense tensor of ``shape`` identically? They do when they
    agree once the size-1 dims are left out."""
    a = [int(d) for d in order_a if not _is_one(shape[int(d)])]
    b = [int(d) for d in order_b if not _is_one(shape[int(d)])]
    return a == b


def numel_hint(spec: TensorSpec) -> float:
    total = 1
    for size in spec.shape:
        if not isinstance(size, int):
            hint = getattr(getattr(size, "node", None), "hint", None)
            size = hint if isinstance(hint, int) else 1 << 16
        total *= size
    return float(total)


def fake_in(val: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    rank = len(order)
    if layout_of(order) == CHANNELS_LAST:
        fmt = torch.channels_last if rank == 4 else torch.channels_last_3d
    else:
        fmt = torch.contiguous_format
    return val.clone(memory_format=fmt)


def set_dim_order(spec: TensorSpec, order: tuple[int, ...]) -> None:
    spec.dim_order = tuple(order)
    spec.stride = tuple(stride_from_dim_order(list(spec.shape), list(order)))


def _copy_meta(node: torch.fx.Node, like: torch.fx.Node) -> None:
    node.meta.update(
        {k: v for k, v in like.meta.items() if k in ("stack_trace", "nn_module_stack")}
    )


def spec_like(like: TensorSpec, val: torch.Tensor, order: tuple[int, ...]) -> TensorSpec:
    """A TensorSpec for ``val`` in dim order ``order``, on ``like``'s device."""
    spec = TensorSpec.from_tensor(val)
    set_dim_order(spec, order)
    spec.device, spec.device_index = like.device, like.device_index
    return spec


def insert_view(
    graph: torch.fx.Graph, operand: torch.fx.Node, shape: list[int], before: torch.fx.Node
) -> torch.fx.Node:
    """A ``view_copy`` of a default-dim-order ``operand`` to ``shape``, before ``before``."""
    with graph.inserting_before(before):
        view = graph.call_function(VIEW_COPY, (operand, shape))
    _copy_meta(view, before)
    val = operand.meta["val"].reshape(shape).clone(memory_format=torch.contiguous_format)
    view.meta["val"] = val
    view.meta["tensor_meta"] = None
    view.meta["spec"] = spec_like(operand.meta["spec"], val, tuple(range(len(shape))))
    return view


def insert_conversion(
    graph: torch.fx.Graph,
    source: torch.fx.Node,
    order: tuple[int, ...],
    *,
    before: torch.fx.Node | None = None,
    after: torch.fx.Node | None = None,
) -> torch.fx.Node:
    """``_to_dim_order_copy(source, dim_order=order)`` before or after a node."""
    if before is not None:
        where = graph.inserting_before(before)
    else:
        where = graph.inserting_after(after)
    with where:
        node = graph.call_function(TO_DIM_ORDER, (source,), {"dim_order": list(order)})
    _copy_meta(node, before if before is not None else source)
    val = fake_in(source.meta["val"], order)
    node.meta["val"] = val
    node.meta["tensor_meta"] = None  # what ExportPass records for a fake value
    node.meta["spec"] = spec_like(source.meta["spec"], val, order)
    return node
