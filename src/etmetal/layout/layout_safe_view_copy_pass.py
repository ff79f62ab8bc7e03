"""Layout-safe ``view_copy`` lowering for ``to_executorch``.

ExecuTorch's stock ``ReplaceViewCopyWithViewPass`` turns every ``view_copy`` that does not
feed a graph output into ``memory.view``: a new shape over the base's memory, read in the
default (row-major) dim order. That is only a reshape when the base's memory already is
row-major. On a channels-last base the view reads the bytes in the wrong order and the
program is silently wrong; a kept ``view_copy`` is no better on stock kernels, whose
``view_copy.out`` rejects a base and an output of different dim orders (error 0x12).

This pass makes the decision from each base's TensorSpec (the layout the emitter will
write into the program):

- a ``view_copy`` whose base has the default dim order and is dense in it becomes
  ``memory.view`` (so memory planning gives it the base's storage), under the stock
  pass's safety rules: never for a view feeding a graph output, never when the base or
  any of its views is written to;
- any other ``view_copy`` is kept. With ``legalize_for_stock_kernels`` (the default) an
  explicit ``dim_order_ops._to_dim_order_copy`` to the default dim order is put in front
  of it, which the stock kernels accept whatever ``_skip_dim_order`` was at ``to_edge``;
  the ``view_copy`` then reads a row-major base and may itself become a view. Turn the
  option off when the program runs on etmetal's runtime, whose ``view_copy`` kernel
  handles any dim order.

The pass runs after spec propagation and before symbolic-shape evaluation and memory
planning; ``etmetal.backend_config()`` wires it in there.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  (registers dim_order_ops)
import torch
from executorch.exir import memory
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.passes.replace_view_copy_with_view_pass import _ViewSpec
from executorch.exir.tensor import TensorSpec
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from etmetal.backend.edge_ops import MISSING, schema_argument_value

logger: logging.Logger = logging.getLogger(__name__)

_VIEW_COPY_TARGETS = (torch.ops.aten.view_copy.default, exir_ops.edge.aten.view_copy.default)
_TO_DEFAULT_DIM_ORDER = exir_ops.edge.dim_order_ops._to_dim_order_copy.default

# call_function targets without a schema that never write to their tensor arguments
_READ_ONLY_CALLABLES = (operator.getitem, executorch_call_delegate, memory.view)


class LayoutSafeViewCopyError(ValueError):
    """A graph the pass cannot reason about; the message names the node."""


def is_view_copy(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in _VIEW_COPY_TARGETS


def _spec_of(node: torch.fx.Node, role: str, view: torch.fx.Node) -> TensorSpec:
    spec = node.meta.get("spec")
    if not isinstance(spec, TensorSpec):
        where = "" if node is view else f" (input of view_copy node {view.name!r})"
        found = "no meta['spec']" if spec is None else f"meta['spec'] of type {type(spec).__name__}"
        raise LayoutSafeViewCopyError(
            f"{role} node {node.name!r}{where} has {found}; the pass needs the TensorSpecs "
            "that SpecPropPass attaches, so run it after spec propagation"
        )
    return spec


def _fake_value_of(node: torch.fx.Node, role: str, view: torch.fx.Node) -> torch.Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        where = "" if node is view else f" (input of view_copy node {view.name!r})"
        raise LayoutSafeViewCopyError(
            f"{role} node {node.name!r}{where} has no tensor fake value in meta['val'] "
            f"(found {type(val).__name__})"
        )
    return val


def checked_dim_order(node: torch.fx.Node, spec: TensorSpec) -> tuple[int, ...]:
    """The spec's dim order as ints, or an error naming ``node`` if it is not a permutation
    of the tensor's dimensions."""
    raw = spec.dim_order
    rank = len(spec.shape)
    try:
        dim_order = tuple(int(d) for d in raw)
    except (TypeError, ValueError):
        dim_order = None
    if dim_order is None or sorted(dim_order) != list(range(rank)):
        raise LayoutSafeViewCopyError(
            f"node {node.name!r} has an unknown dim order {raw!r} for a rank-{rank} tensor "
            f"(shape {list(spec.shape)}); expected a permutation of {list(range(rank))}"
        )
    if len(spec.stride) != rank:
        raise LayoutSafeViewCopyError(
            f"node {node.name!r} has a TensorSpec with {len(spec.stride)} strides for "
            f"shape {list(spec.shape)}"
        )
    return dim_order


def _known_equal(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return statically_known_true(a == b)


def is_row_major_dense(node: torch.fx.Node, spec: TensorSpec) -> bool:
    """True when ``spec`` describes memory a row-major reshape can reinterpret: the
    default dim order, and strides dense in it (size-1 dims may have any stride)."""
    dim_order = checked_dim_order(node, spec)
    if dim_order != tuple(range(len(dim_order))):
        return False
    expected = 1
    for d in reversed(dim_order):
        size, stride = spec.shape[d], spec.stride[d]
        if _known_equal(size, 1):
            continue
        if not _known_equal(stride, expected):
            return False
        expected = expected * size
    return True


def _written_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Nodes some other node writes to (schema arguments marked ``(a!)``). Callables
    without a schema, other than the known read-only ones, count as writing all their
    tensor arguments."""
    written: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or node.target in _READ_ONLY_CALLABLES:
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            written.update(node.all_input_nodes)
            continue
        for index, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = schema_argument_value(node, index, argument)
            if value is MISSING:
                continue
            written.update(_flat_nodes(value))
    return written


def _flat_nodes(value: Any) -> Iterable[torch.fx.Node]:
    if isinstance(value, torch.fx.Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat_nodes(item)


def _feeds_output(node: torch.fx.Node) -> bool:
    # The runtime may swap an output's data pointer, so an output must own its memory.
    return any(user.op == "output" for user in node.users)


class LayoutSafeViewCopyPass(PassBase):
    """Replace ``view_copy`` with ``memory.view`` only where that is a pure reinterpretation
    of the base's memory; legalize the kept ones for the stock kernels.

    Args:
        replace_views: turn safe ``view_copy`` nodes into ``memory.view`` (what
            ``remove_view_copy=True`` asks for). With False only legalization happens.
        legalize_for_stock_kernels: put a conversion to the default dim order in front of
            each kept ``view_copy`` whose base has another dim order (the stock portable
            kernel rejects it). Off for etmetal's runtime, whose kernel handles any layout.
    """

    def __init__(self, replace_views: bool = True, legalize_for_stock_kernels: bool = True):
        super().__init__()
        self.replace_views = replace_views
        self.legalize_for_stock_kernels = legalize_for_stock_kernels
        # counts from the last call, for logs and tests
        self.stats: dict[str, int] = {}

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        self.stats = {"replaced": 0, "kept": 0, "legalized": 0}
        for module in graph_module.modules():
            if isinstance(module, torch.fx.GraphModule):
                self._run_on_graph(module.graph)
                module.recompile()
        logger.debug("layout-safe view_copy lowering: %s", self.stats)
        return PassResult(graph_module, self.stats["replaced"] + self.stats["legalized"] > 0)

    def _run_on_graph(self, graph: torch.fx.Graph) -> None:
        views = [node for node in graph.nodes if is_view_copy(node)]
        for view in views:  # check everything before changing anything
            base = view.args[0]
            if not isinstance(base, torch.fx.Node):
                raise LayoutSafeViewCopyError(
                    f"view_copy node {view.name!r} has input {base!r}, not a graph node"
                )
            checked_dim_order(view, _spec_of(view, "view_copy", view))
            checked_dim_order(base, _spec_of(base, "input", view))
            _fake_value_of(view, "view_copy", view)
            _fake_value_of(base, "input", view)
        if self.replace_views:
            views = self._normalize_bases(graph, views)
        written = _written_nodes(graph)
        conversions: dict[torch.fx.Node, torch.fx.Node] = {}
        for view in views:
            base = view.args[0]
            base_spec = base.meta["spec"]
            if not is_row_major_dense(base, base_spec):
                if not self.legalize_for_stock_kernels:
                    self.stats["kept"] += 1
                    continue
                if base not in conversions:
                    conversions[base] = self._insert_conversion(graph, base, before=view)
                    self.stats["legalized"] += 1
                base = conversions[base]
                view.args = (base, *view.args[1:])
            if self.replace_views and self._may_alias(view, base, written):
                self._make_view(view, base)
                self.stats["replaced"] += 1
            else:
                self.stats["kept"] += 1

    @staticmethod
    def _normalize_bases(
        graph: torch.fx.Graph, views: Sequence[torch.fx.Node]
    ) -> list[torch.fx.Node]:
        # A reshape of a reshape is a reshape of the first base: point every view_copy
        # at the first node upstream that is not one, so bases are real buffers, and
        # drop the intermediate ones nothing reads any more.
        for view in views:  # topological order: an upstream view is already normalized
            base = view.args[0]
            if is_view_copy(base):
                view.args = (base.args[0], *view.args[1:])
        kept = []
        for view in reversed(views):
            if view.users:
                kept.append(view)
            else:
                graph.erase_node(view)
        return kept[::-1]

    @staticmethod
    def _may_alias(view: torch.fx.Node, base: torch.fx.Node, written: set[torch.fx.Node]) -> bool:
        if _feeds_output(view):
            return False
        if not is_row_major_dense(view, view.meta["spec"]):
            return False  # view_copy always yields row-major; anything else is a copy
        # once aliased, a write to the base or to any of its views is seen by all of them
        aliases = {base, *(user for user in base.users if is_view_copy(user))}
        aliases.update(user for user in base.users if user.target == memory.view)
        return not (aliases & written)

    @staticmethod
    def _make_view(view: torch.fx.Node, base: torch.fx.Node) -> None:
        # The node's shape, not its size argument: that may hold an inferred -1.
        shape = list(view.meta["val"].shape)
        view.target = memory.view
        view.meta["spec"] = _ViewSpec(base.meta["spec"], shape)

    @staticmethod
    def _insert_conversion(
        graph: torch.fx.Graph, base: torch.fx.Node, before: torch.fx.Node
    ) -> torch.fx.Node:
        base_val = _fake_value_of(base, "input", before)
        base_spec: TensorSpec = base.meta["spec"]
        rank = len(base_spec.shape)
        with graph.inserting_before(before):
            node = graph.call_function(
                _TO_DEFAULT_DIM_ORDER, (base,), {"dim_order": list(range(rank))}
            )
        node.meta.update(
            {k: v for k, v in before.meta.items() if k in ("stack_trace", "nn_module_stack")}
        )
        # clone, not .contiguous(): with size-1 dims a channels-last tensor already counts
        # as contiguous and would keep strides that read back as a channels-last dim order
        val = base_val.clone(memory_format=torch.contiguous_format)
        node.meta["val"] = val
        node.meta["tensor_meta"] = None  # what ExportPass records for a fake value
        spec = TensorSpec.from_tensor(val)
        spec.dim_order = tuple(range(rank))
        spec.device, spec.device_index = base_spec.device, base_spec.device_index
        node.meta["spec"] = spec
        return node
