"""Turn ``*_copy`` view operators back into views before AOTInductor sees them.

Edge dialect spells every view as a copy (``slice_copy``, ``select_copy``,
``split_copy``, ``view_copy``...). Inductor has no lowering for several of them, so
as copies they become shim fallbacks the runtime does not provide, while their view
forms are free (a reinterpretation of the same buffer). A copy may only become a
view when nobody can observe the aliasing: neither the copy's result (or a view of
it) nor the storage it was taken from is written anywhere in the graph, and the
result does not leave the graph as an alias of a graph input. Where that does not
hold, the copy becomes ``view + clone``: still lowerable, still a real copy.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from etmetal.backend.edge_ops import aten_overload

aten = torch.ops.aten

# every edge-dialect copy whose view form is a pure reinterpretation of the same buffer;
# as views Inductor also recognises its fusion patterns (attention: matmul, transpose,
# softmax, matmul -> one SDPA call)
VIEW_OF_COPY: dict[Any, Any] = {
    aten.slice_copy.Tensor: aten.slice.Tensor,
    aten.select_copy.int: aten.select.int,
    aten.split_copy.Tensor: aten.split.Tensor,
    aten.split_with_sizes_copy.default: aten.split_with_sizes.default,
    aten.unbind_copy.int: aten.unbind.int,
    aten.view_copy.default: aten.view.default,
    aten.transpose_copy.int: aten.transpose.int,
    aten.permute_copy.default: aten.permute.default,
    aten.t_copy.default: aten.t.default,
    aten.expand_copy.default: aten.expand.default,
    aten.unsqueeze_copy.default: aten.unsqueeze.default,
    aten.squeeze_copy.default: aten.squeeze.default,
    aten.squeeze_copy.dim: aten.squeeze.dim,
    aten.squeeze_copy.dims: aten.squeeze.dims,
    aten.diagonal_copy.default: aten.diagonal.default,
    aten.alias_copy.default: aten.alias.default,
}
# ops returning a list of views: each piece is cloned as it is taken (getitem)
_LIST_VIEWS = (aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)


def _aten(target: Any) -> Any:
    return aten_overload(target)


def _is_view(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:  # an element of a split's result
        return _is_view(node.args[0]) if isinstance(node.args[0], fx.Node) else False
    return bool(getattr(_aten(node.target), "is_view", False))


def _writes(user: fx.Node, node: fx.Node) -> bool:
    """Does ``user`` write into ``node``'s storage?"""
    if user.op == "call_method":
        return str(user.target).endswith("_")
    schema = getattr(_aten(user.target), "_schema", None) if user.op == "call_function" else None
    if schema is None:
        return False
    for i, arg in enumerate(user.args):
        if arg is node and i < len(schema.arguments):
            info = schema.arguments[i].alias_info
            if info is not None and info.is_write:
                return True
    by_name = {a.name: a for a in schema.arguments}
    for name, arg in user.kwargs.items():
        if arg is node and name in by_name:
            info = by_name[name].alias_info
            if info is not None and info.is_write:
                return True
    return False


class ReplaceViewCopyWithViewPass(PassBase):
    """``mutated_inputs`` names placeholders the program writes back (mutated buffers and
    user inputs); ``as_view``/``as_copy`` count the copies that became views and
    ``view + clone``."""

    def __init__(self, mutated_inputs: set[str] | None = None) -> None:
        super().__init__()
        self.mutated_inputs = set(mutated_inputs or ())
        self.as_view = 0
        self.as_copy = 0

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        gm = graph_module
        graph = gm.graph
        written_roots = {
            self._root(n)
            for n in graph.nodes
            if n.op == "placeholder" and n.name in self.mutated_inputs
        }
        for n in graph.nodes:
            for arg in (*n.args, *n.kwargs.values()):
                if isinstance(arg, fx.Node) and _writes(n, arg):
                    written_roots.add(self._root(arg))
        output_args = set(graph.output_node().all_input_nodes)
        changed = False
        for node in list(graph.nodes):
            if node.op != "call_function" or _aten(node.target) not in VIEW_OF_COPY:
                continue
            view_op = VIEW_OF_COPY[_aten(node.target)]
            source = node.args[0]
            root = self._root(source) if isinstance(source, fx.Node) else None
            if self._safe_as_view(node, root, written_roots, output_args):
                node.target = view_op
                self.as_view += 1
            else:
                self._view_then_clone(graph, node, view_op)
                self.as_copy += 1
            changed = True
        if changed:
            graph.lint()
            gm.recompile()
        return PassResult(gm, changed)

    def _root(self, node: fx.Node) -> fx.Node:
        while _is_view(node) and isinstance(node.args[0], fx.Node):
            node = node.args[0]
        return node

    def _view_closure(self, node: fx.Node) -> list[fx.Node]:
        seen, todo = [node], [node]
        while todo:
            for user in todo.pop().users:
                if user not in seen and (
                    user.target is operator.getitem  # an element of a split's list
                    or _is_view(user)
                    or _aten(user.target) in VIEW_OF_COPY
                ):
                    seen.append(user)
                    todo.append(user)
        return seen

    def _safe_as_view(
        self, node: fx.Node, root: fx.Node | None, written: set[fx.Node], outputs: set[fx.Node]
    ) -> bool:
        if root is None or root in written:
            return False
        closure = self._view_closure(node)
        for member in closure:
            if any(_writes(user, member) for user in member.users):
                return False
        # a view of a graph input returned as an output would alias the caller's tensor
        return not (root.op == "placeholder" and any(m in outputs for m in closure))

    def _view_then_clone(self, graph: fx.Graph, node: fx.Node, view_op: Any) -> None:
        node.target = view_op
        if _aten(view_op) in _LIST_VIEWS:
            # clone each piece as it is taken from the list
            for user in list(node.users):
                if user.target is operator.getitem:
                    self._clone_after(graph, user)
        else:
            self._clone_after(graph, node)

    def _clone_after(self, graph: fx.Graph, node: fx.Node) -> None:
        with graph.inserting_after(node):
            clone = graph.call_function(aten.clone.default, (node,))
        clone.meta = dict(node.meta)
        node.replace_all_uses_with(clone, delete_user_cb=lambda u: u is not clone)
