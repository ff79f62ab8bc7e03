"""Make every operator's tensors carry dim orders its stock portable kernel accepts.

A channels-last program mixes layouts: a reshape yields a default-dim-order tensor in the
middle of channels-last convolutions, a 1-D bias meets a 4-D channels-last activation, a
channels-last tensor with one channel gets a third dim order from its strides. Eager
PyTorch computes all of these; ExecuTorch's portable kernels check the dim-order labels
(``stock_kernel_layouts``) and stop with error 0x12. This pass visits the graph in
topological order and, for each checked operator, picks the layout it runs in (default or
channels-last) that costs the fewest converted elements:

- an input in another layout is converted with ``dim_order_ops._to_dim_order_copy`` (one
  conversion per tensor and layout, shared by later users); a lower-rank operand of a
  broadcasting operator is first given leading size-1 dims;
- an output whose memory is the same in both layouts (size-1 dims) is only relabelled;
- an output nobody but checked operators reads is computed in the chosen layout, and its
  readers adapt in turn; an output a graph output, a ``memory.view`` or an unchecked reader
  depends on keeps its declared dim order, converted back after the operator;
- ``clone``/``_to_copy`` that change the layout (what ``_skip_dim_order=True`` gives for
  ``.contiguous()`` and ``.to(memory_format=...)``) become ``_to_dim_order_copy``, which
  the stock runtime runs whatever the edge config was.

What no conversion can fix (an output whose declared dim order no stock kernel can write)
raises :class:`StockKernelLayoutError` naming the node and the kernel's check. A program
whose tensors are all in the default dim order is left unchanged.
"""

from __future__ import annotations

import logging
import math
import operator
from dataclasses import dataclass, field

import torch
from executorch.exir import memory
from executorch.exir.tensor import TensorSpec
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from etmetal.backend.edge_ops import MISSING, aten_overload, schema_argument_value

from .dim_order_layouts import (
    CHANNELS_LAST,
    CONTIGUOUS,
    TO_DIM_ORDER,
    can_be,
    dim_order_of,
    fake_in,
    insert_conversion,
    insert_view,
    layout_of,
    numel_hint,
    same_memory,
    set_dim_order,
)
from .layout_safe_view_copy_pass import LayoutSafeViewCopyError
from .stock_kernel_layouts import (
    CONVERSION,
    COPY,
    DEFAULT,
    KernelLayoutRule,
    rule_for,
)

logger: logging.Logger = logging.getLogger(__name__)

_INF = math.inf
_INSERTED = "etmetal_dim_order_conversion"  # meta key marking the nodes this pass adds


class StockKernelLayoutError(LayoutSafeViewCopyError):
    """An operator whose tensors no conversion can bring to dim orders its stock kernel
    accepts; the message names the node and the kernel's check."""


@dataclass
class _Output:
    """One tensor a node writes: its spec, its fake value's place, and who reads it."""

    spec: TensorSpec
    holder: torch.fx.Node  # the node whose users read the tensor (the node or a getitem)
    index: int | None  # position in a list result


@dataclass
class _Plan:
    layout: str
    cost: float = 0.0
    inputs: list[tuple[torch.fx.Node, tuple[int, ...]]] = field(default_factory=list)
    outputs: list[tuple[_Output, str]] = field(default_factory=list)  # "relabel"/"back"


class LegalizeDimOrdersPass(PassBase):
    """Insert the dim-order conversions the stock portable kernels need (see the module
    docstring). ``stats`` counts what the last call did."""

    def __init__(self) -> None:
        super().__init__()
        self.stats: dict[str, int] = {}
        self._converted: dict[tuple[torch.fx.Node, tuple[int, ...]], torch.fx.Node] = {}

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        self.stats = {
            "converted_inputs": 0,
            "converted_outputs": 0,
            "relabelled": 0,
            "rewritten_copies": 0,
        }
        self._converted = {}
        graph = graph_module.graph
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            rule = rule_for(node.target)
            if rule is None or not self._has_tensor_specs(node):
                continue
            if rule.kind in (CONVERSION, COPY):
                self._legalize_conversion(graph, node, rule)
            else:
                self._legalize_kernel(graph, node, rule)
        self._drop_unused_conversions(graph)
        graph_module.recompile()
        logger.debug("dim-order legalization: %s", self.stats)
        return PassResult(graph_module, any(self.stats.values()))

    def _drop_unused_conversions(self, graph: torch.fx.Graph) -> None:
        # a conversion back to an output's declared dim order is unused when every reader
        # took the unconverted output instead (the layout it needed)
        for node in reversed(list(graph.nodes)):
            if node.meta.get(_INSERTED) == "output" and not node.users:
                graph.erase_node(node)
                self.stats["converted_outputs"] -= 1

    # --- what a node reads and writes -------------------------------------------------

    @staticmethod
    def _has_tensor_specs(node: torch.fx.Node) -> bool:
        spec = node.meta.get("spec")
        if isinstance(spec, TensorSpec):
            return True
        return isinstance(spec, (list, tuple)) and any(isinstance(s, TensorSpec) for s in spec)

    @staticmethod
    def _operands(node: torch.fx.Node) -> list[tuple[str, torch.fx.Node]]:
        """(schema argument name, node) for every tensor the node reads."""
        schema = aten_overload(node.target)._schema
        found = []
        for index, arg in enumerate(schema.arguments):
            value = schema_argument_value(node, index, arg)
            if value is MISSING:
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            for item in values:
                if isinstance(item, torch.fx.Node) and isinstance(
                    item.meta.get("spec"), TensorSpec
                ):
                    found.append((arg.name, item))
        return found

    @staticmethod
    def _outputs(node: torch.fx.Node) -> list[_Output]:
        spec = node.meta["spec"]
        if isinstance(spec, TensorSpec):
            return [_Output(spec, node, None)]
        outputs = []
        for index, item in enumerate(spec):
            if not isinstance(item, TensorSpec):
                continue
            holders = [u for u in node.users if u.target is operator.getitem and u.args[1] == index]
            outputs.append(_Output(item, holders[0] if holders else node, index))
        return outputs

    @staticmethod
    def _readers(output: _Output) -> list[torch.fx.Node]:
        if output.index is not None and output.holder.target is not operator.getitem:
            return []  # an element of a list result nobody takes
        return list(output.holder.users)

    def _output_option(self, output: _Output, layout: str) -> tuple[str | None, float]:
        """How ``output`` comes to have ``layout``: ("keep"|"relabel"|"back", cost)."""
        spec = output.spec
        current = tuple(int(d) for d in spec.dim_order)
        rank = len(current)
        if not can_be(layout, rank):
            return None, _INF
        if layout_of(current) == layout:
            return "keep", 0.0
        readers = self._readers(output)
        if output.index is not None and output.holder.target is not operator.getitem:
            return "relabel", 0.0  # an element of a list result nobody takes
        if any(r.op == "call_function" and r.target == memory.view for r in readers):
            return None, _INF  # a view shares this storage and reads it row-major
        if same_memory(spec.shape, current, dim_order_of(layout, rank)):
            return "relabel", 0.0
        if readers and all(
            r.op == "call_function" and rule_for(r.target) is not None for r in readers
        ):
            return "relabel", 0.0  # every reader is checked too and adapts to the new one
        if layout_of(current) is not None:
            return "back", numel_hint(spec)
        return None, _INF

    # --- planning ----------------------------------------------------------------------

    def _plan(self, node: torch.fx.Node, rule: KernelLayoutRule, layout: str) -> _Plan:
        plan = _Plan(layout)
        outputs = self._outputs(node)
        out_rank = max(len(o.spec.shape) for o in outputs)
        seen: set[torch.fx.Node] = set()
        operands = self._operands(node)
        if layout != CONTIGUOUS and rule.broadcasting and self._broadcasts(operands, outputs):
            plan.cost = _INF  # the stock kernels index a broadcast operand row-major
            return plan
        for name, operand in operands:
            if name in rule.unchecked or operand in seen:
                continue
            seen.add(operand)
            spec: TensorSpec = operand.meta["spec"]
            current = layout_of(spec.dim_order)
            rank = len(spec.shape)
            if name in rule.exempt:
                if current is None:  # only needs to be default or channels-last
                    plan.inputs.append((operand, dim_order_of(CONTIGUOUS, rank)))
                    plan.cost += self._conversion_cost(operand, CONTIGUOUS, rank)
                continue
            if current == layout:
                continue
            target_rank = rank
            if not can_be(layout, rank):
                if not (rule.broadcasting and rank < out_rank and numel_hint(spec) == 1):
                    plan.cost = _INF
                    return plan
                target_rank = out_rank  # a single value: leading size-1 dims, then the label
            order = dim_order_of(layout, target_rank)
            plan.inputs.append((operand, order))
            plan.cost += self._conversion_cost(operand, layout, target_rank)
        for output in outputs:
            how, cost = self._output_option(output, layout)
            if how is None:
                plan.cost = _INF
                return plan
            plan.cost += cost
            if how != "keep":
                plan.outputs.append((output, how))
        return plan

    @staticmethod
    def _broadcasts(operands: list[tuple[str, torch.fx.Node]], outputs: list[_Output]) -> bool:
        """Does an operand of more than one element broadcast to the output's shape?"""
        shape = list(outputs[0].spec.shape)
        for _, operand in operands:
            spec = operand.meta["spec"]
            if list(spec.shape) != shape and numel_hint(spec) != 1:
                return True
        return False

    def _conversion_cost(self, operand: torch.fx.Node, layout: str, rank: int) -> float:
        if (operand, dim_order_of(layout, rank)) in self._converted:
            return 0.0
        return numel_hint(operand.meta["spec"])

    def _best_plan(self, node: torch.fx.Node, rule: KernelLayoutRule) -> _Plan:
        first = self._outputs(node)[0].spec
        declared = layout_of(first.dim_order) or CONTIGUOUS
        layouts = [CONTIGUOUS] if rule.kind == DEFAULT else [declared]
        if rule.kind != DEFAULT:
            layouts += [x for x in (CONTIGUOUS, CHANNELS_LAST) if x != declared]
        plans = [self._plan(node, rule, layout) for layout in layouts]
        best = min(plans, key=lambda p: p.cost)  # first wins a tie: the declared layout
        if best.cost == _INF:
            raise StockKernelLayoutError(self._refusal(node, rule))
        return best

    def _refusal(self, node: torch.fx.Node, rule: KernelLayoutRule) -> str:
        tensors = [
            f"{name}={n.name} dim_order {tuple(n.meta['spec'].dim_order)}"
            for name, n in self._operands(node)
        ]
        outs = [f"out dim_order {tuple(o.spec.dim_order)}" for o in self._outputs(node)]
        return (
            f"node {node.name!r} ({aten_overload(node.target)}) cannot run on the stock "
            f"portable kernel, which requires {rule.check}: no conversion gives "
            f"{', '.join(tensors + outs)} dim orders it accepts without changing a dim "
            "order the program declares (a graph output or a memory.view base)"
        )

    # --- rewriting -----------------------------------------------------------------------

    def _legalize_kernel(
        self, graph: torch.fx.Graph, node: torch.fx.Node, rule: KernelLayoutRule
    ) -> None:
        plan = self._best_plan(node, rule)
        for operand, order in plan.inputs:
            converted = self._convert(graph, operand, order, before=node)
            node.replace_input_with(operand, converted)
        self._apply_outputs(graph, node, plan)

    def _legalize_conversion(
        self, graph: torch.fx.Graph, node: torch.fx.Node, rule: KernelLayoutRule
    ) -> None:
        (output,) = self._outputs(node)
        declared = layout_of(output.spec.dim_order)
        plans = []
        for layout in ([declared] if declared else []) + [CONTIGUOUS, CHANNELS_LAST]:
            plan = _Plan(layout)
            how, plan.cost = self._output_option(output, layout)
            if how is None:
                continue
            if how != "keep":
                plan.outputs.append((output, how))
            plans.append(plan)
        if not plans:
            raise StockKernelLayoutError(self._refusal(node, rule))
        plan = min(plans, key=lambda p: p.cost)
        self._apply_outputs(graph, node, plan)
        order = tuple(int(d) for d in output.spec.dim_order)
        (base,) = [n for _, n in self._operands(node)]
        name = aten_overload(node.target)._schema.name
        if rule.kind == COPY:
            in_layout = layout_of(base.meta["spec"].dim_order)
            fmt = node.kwargs.get("memory_format")
            fine = in_layout == layout_of(order) and fmt in (None, torch.contiguous_format)
            if name == "aten::_to_copy":
                fine = fine and in_layout == CONTIGUOUS
            if fine:
                return
            dtype = node.kwargs.get("dtype")
            node.target = TO_DIM_ORDER
            node.args = (base,)
            node.kwargs = {"dim_order": list(order), **({"dtype": dtype} if dtype else {})}
            self.stats["rewritten_copies"] += 1
        elif node.kwargs.get("dim_order") is None or tuple(node.kwargs["dim_order"]) != order:
            node.kwargs = {**node.kwargs, "dim_order": list(order)}
            self.stats["rewritten_copies"] += 1

    def _apply_outputs(self, graph: torch.fx.Graph, node: torch.fx.Node, plan: _Plan) -> None:
        for output, how in plan.outputs:
            old = tuple(int(d) for d in output.spec.dim_order)
            new = dim_order_of(plan.layout, len(old))
            set_dim_order(output.spec, new)
            self._set_fake(node, output, new)
            if how == "relabel":
                self.stats["relabelled"] += 1
                continue
            holder = output.holder
            readers = list(holder.users)
            back = insert_conversion(graph, holder, old, after=holder)
            back.meta[_INSERTED] = "output"
            for reader in readers:
                reader.replace_input_with(holder, back)
            self._converted[(back, new)] = holder
            self.stats["converted_outputs"] += 1

    @staticmethod
    def _set_fake(node: torch.fx.Node, output: _Output, order: tuple[int, ...]) -> None:
        if output.index is None:
            node.meta["val"] = fake_in(node.meta["val"], order)
            return
        values = list(node.meta["val"])
        values[output.index] = fake_in(values[output.index], order)
        node.meta["val"] = type(node.meta["val"])(values)
        if output.holder is not node:
            output.holder.meta["val"] = values[output.index]

    def _convert(
        self,
        graph: torch.fx.Graph,
        operand: torch.fx.Node,
        order: tuple[int, ...],
        before: torch.fx.Node,
    ) -> torch.fx.Node:
        key = (operand, order)
        if key not in self._converted:
            source = operand
            shape = list(operand.meta["spec"].shape)
            if len(shape) < len(order):  # a broadcast operand: leading size-1 dims first
                padded = [1] * (len(order) - len(shape)) + shape
                source = insert_view(graph, operand, padded, before=before)
            self._converted[key] = insert_conversion(graph, source, order, before=before)
            self._converted[key].meta[_INSERTED] = "input"
            self.stats["converted_inputs"] += 1
        return self._converted[key]
