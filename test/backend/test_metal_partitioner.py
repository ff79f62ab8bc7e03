"""MetalPartitioner decisions, checked on edge programs without compiling anything."""

from __future__ import annotations

import logging
import operator
import warnings

import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch import nn

from etmetal.backend.metal_partitioner import MetalPartitioner
from etmetal.backend.supported_ops import TargetCapabilities


def edge_program(module: nn.Module, *inputs: torch.Tensor):
    return to_edge(torch.export.export(module.eval(), inputs)).exported_program()


def tags_of(ep) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in ep.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag is not None:
            out.setdefault(tag, set()).add(node.name)
    return out


def is_convex(ep, names: set[str]) -> bool:
    """No path leaves the node set and comes back (fusing it would form a cycle)."""
    nodes = [n for n in ep.graph.nodes if n.name in names]
    outside_reached: set[torch.fx.Node] = set()
    todo = [u for n in nodes for u in n.users if u.name not in names]
    while todo:
        node = todo.pop()
        if node in outside_reached:
            continue
        outside_reached.add(node)
        for user in node.users:
            if user.name in names:
                return False
            todo.append(user)
    return True


# -- target selection ----------------------------------------------------------
def test_auto_target_picks_host_without_mps_and_logs_it(caplog):
    with caplog.at_level(logging.INFO, logger="etmetal.backend.targets"):
        partitioner = MetalPartitioner()
    assert partitioner.target == ("mps" if torch.backends.mps.is_available() else "host")
    assert any("target auto -> host" in r.getMessage() for r in caplog.records)
    spec = {s.key: s.value for s in partitioner.delegation_spec.compile_specs}
    assert spec["target"] == b"host"


def test_mps_target_fails_at_once_off_macos():
    with pytest.raises(RuntimeError, match="needs macOS with an MPS device.*target='host'"):
        MetalPartitioner(target="mps")


@pytest.mark.parametrize("target", ["cuda", "Host", "", None, 3])
def test_unknown_target_names_the_choices(target):
    with pytest.raises(ValueError, match=r"unknown Metal target .*'auto', 'host', 'mps'"):
        MetalPartitioner(target=target)


# -- compile specs -------------------------------------------------------------
@pytest.mark.parametrize(
    ("specs", "error", "message"),
    [
        ([("codesign_identity", b"-")], TypeError, r"compile_specs\[0\] is a tuple"),
        (CompileSpec("codesign_identity", b"-"), TypeError, "must be a list"),
        ({"codesign_identity": b"-"}, TypeError, "must be a list"),
        ([CompileSpec("codesign_identity", "-")], TypeError, "bytes value"),
        ([CompileSpec("opt_level", b"3")], ValueError, "unknown key 'opt_level'"),
        ([CompileSpec("target", b"gpu")], ValueError, "unknown Metal target 'gpu'"),
    ],
)
def test_bad_compile_specs_say_what_to_change(specs, error, message):
    with pytest.raises(error, match=message):
        MetalPartitioner(specs, target="host")


def test_target_from_compile_spec_and_extra_specs_are_kept():
    specs = [CompileSpec("method_name", b"forward"), CompileSpec("target", b"host")]
    partitioner = MetalPartitioner(specs)
    keys = [s.key for s in partitioner.delegation_spec.compile_specs]
    assert partitioner.target == "host" and keys == ["method_name", "target"]


# -- what goes in --------------------------------------------------------------
class Sandwich(nn.Module):
    """x -> mul -> sort (kept out on host) -> add, plus mul feeding add directly:
    one partition {mul, add} would not be convex."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x * 3.0
        b = torch.sort(a, dim=-1).values
        return torch.relu(b) + a


def test_partitions_are_convex_and_kept_out_ops_are_logged(caplog):
    ep = edge_program(Sandwich(), torch.randn(2, 5))
    partitioner = MetalPartitioner(target="host")
    with caplog.at_level(logging.INFO, logger="etmetal.backend.metal_partitioner"):
        result = partitioner.partition(ep)
    tags = tags_of(result.tagged_exported_program)
    assert len(tags) == 2 == len(result.partition_tags)
    for names in tags.values():
        assert is_convex(result.tagged_exported_program, names)
    sort = [n for n in ep.graph.nodes if "sort" in str(n.target)]
    assert sort and "delegation_tag" not in sort[0].meta
    lines = [r.getMessage() for r in caplog.records if "keeping" in r.getMessage()]
    assert len(lines) == 1 and "aten.sort.default" in lines[0]
    assert "aoti_torch_cpu_sort_stable" in lines[0]
    report = partitioner.report
    assert report.kept_out_ops == {"aten.sort.default": 1}
    assert "kept out: aten.sort.default" in report.text()


class WithConstants(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Parameter(torch.randn(5))
        self.shared = nn.Parameter(torch.randn(5))
        self.outside = nn.Parameter(torch.randn(5))
        self.register_buffer("unused", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.inner + self.shared
        # sort is kept out; `shared` feeds both sides, `outside` only the sort
        return y + torch.sort(self.outside, dim=0).values + torch.sort(self.shared, dim=0).values


def test_constants_are_tagged_with_their_partition():
    ep = edge_program(WithConstants(), torch.randn(2, 5))
    result = MetalPartitioner(target="host").partition(ep)
    sig = ep.graph_signature
    by_target = {
        **{v: k for k, v in sig.inputs_to_parameters.items()},
        **{v: k for k, v in sig.inputs_to_buffers.items()},
    }
    node = {n.name: n for n in result.tagged_exported_program.graph.nodes}
    tag_of = {t: node[by_target[t]].meta.get("delegation_tag") for t in by_target}
    assert tag_of["inner"] is not None
    # exir's convention: a constant goes with a delegate that reads it (exir copies it
    # for readers outside); one only read outside stays a program constant
    assert tag_of["shared"] is not None
    assert tag_of["outside"] is None
    # an unused buffer goes with the first partition instead of dangling
    assert tag_of["unused"] == next(iter(result.partition_tags))


def test_no_delegatable_op_warns_with_what_to_change():
    class OnlySort(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sort(x, dim=0).values

    ep = torch.export.export(OnlySort(), (torch.randn(4, 3),))
    with pytest.warns(UserWarning, match=r"found no operator it can delegate.*sort.*replace"):
        edge = to_edge_transform_and_lower(ep, partitioner=[MetalPartitioner(target="host")])
    assert not edge.to_executorch().executorch_program.execution_plan[0].delegates


def test_program_without_operators_warns_nothing_to_compute():
    class Identity(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    ep = edge_program(Identity(), torch.randn(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MetalPartitioner(target="host").partition(ep)
    assert any("no operator left to delegate" in str(w.message) for w in caught)


def test_ops_to_not_decompose_keeps_only_ops_supported_everywhere():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(x, x, x) + self.linear(x)

    ep = torch.export.export(Model(), (torch.randn(1, 2, 3, 4),))
    ops, check = MetalPartitioner(target="host").ops_to_not_decompose(ep)
    names = {str(op) for op in ops}
    assert check is None
    assert {"aten.linear.default", "aten.scaled_dot_product_attention.default"} <= names
    # core ATen ops need no protection from decomposition
    assert all(torch.Tag.core not in op.tags for op in ops)


def test_control_flow_stays_out_with_its_branches():
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2.0
            return torch.cond(y.sum() > 0, lambda t: t * 2.0, lambda t: t - 1.0, (y,)) + 1.0

    ep = edge_program(Branchy(), torch.randn(3))
    partitioner = MetalPartitioner(target="host")
    result = partitioner.partition(ep)
    graph = result.tagged_exported_program.graph
    cond = next(n for n in graph.nodes if n.target is torch.ops.higher_order.cond)
    branches = [a for a in cond.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
    assert "delegation_tag" not in cond.meta and len(branches) == 2
    assert all("delegation_tag" not in b.meta for b in branches)
    assert partitioner.report.kept_out_ops == {"higher_order.cond": 1}
    # the ops around it are still delegated, on both sides
    assert len(result.partition_tags) == 2


# -- capability checks, node by node -------------------------------------------
def _node(module: nn.Module, *inputs: torch.Tensor, op: str) -> torch.fx.Node:
    ep = torch.export.export(module, inputs)
    return next(n for n in ep.graph.nodes if n.op == "call_function" and str(n.target) == op)


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor):
        return self.fn(*xs)


def _avg2d(kernel: int, stride: int):
    return lambda x: torch.nn.functional.avg_pool2d(x, kernel, stride)


def _avg3d(kernel: int, stride: int):
    return lambda x: torch.nn.functional.avg_pool3d(x, kernel, stride)


@pytest.mark.parametrize(
    ("fn", "inputs", "op", "supported", "why"),
    [
        (lambda a, b: a @ b, [(3, 4), (4, 5)], "aten.matmul.default", True, "cpu_mm_out"),
        (torch.bmm, [(2, 3, 4), (2, 4, 5)], "aten.bmm.default", True, "aoti_torch_cpu_bmm_out"),
        (lambda x: torch.topk(x, 2)[0], [(3, 6)], "aten.topk.default", True, "cpu_topk"),
        (lambda x: x.exp() + 1, [(3,)], "aten.exp.default", True, "generated kernel"),
        (
            lambda a, b, c: torch.baddbmm(a, b, c),
            [(2, 3, 5), (2, 3, 4), (2, 4, 5)],
            "aten.baddbmm.default",
            True,
            "aoti_torch_cpu_baddbmm_out",
        ),
        (lambda x: torch.sort(x)[0], [(3, 6)], "aten.sort.default", False, "cpu_sort_stable"),
        (lambda x: torch.nonzero(x), [(3, 6)], "aten.nonzero.default", False, "data-dependent"),
        # Inductor generates small or non-overlapping windows, falls back for the others
        (_avg2d(2, 2), [(1, 2, 8, 8)], "aten.avg_pool2d.default", True, "generated kernel"),
        (_avg2d(6, 6), [(1, 2, 12, 12)], "aten.avg_pool2d.default", True, "generated kernel"),
        (_avg2d(6, 2), [(1, 2, 12, 12)], "aten.avg_pool2d.default", True, "cpu_avg_pool2d"),
        (_avg3d(3, 2), [(1, 2, 6, 6, 6)], "aten.avg_pool3d.default", True, "cpu_avg_pool3d"),
        (
            lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (2, 2, 2)),
            [(1, 2, 5, 6, 7)],
            "aten.adaptive_avg_pool3d.default",
            True,
            "cpu__adaptive_avg_pool3d",
        ),
    ],
)
def test_host_capabilities(fn, inputs, op, supported, why):
    node = _node(_Fn(fn), *(torch.randn(*s) for s in inputs), op=op)
    verdict = TargetCapabilities("host").check_node(node)
    assert verdict.supported is supported
    assert why in verdict.reason


def test_getitem_follows_its_producer():
    node = _node(
        _Fn(lambda x: torch.sort(x)[0]), torch.randn(3, 4), op="<built-in function getitem>"
    )
    assert node.target is operator.getitem
    assert not TargetCapabilities("host").check_node(node).supported


def test_avg_pool_fallback_stays_out_on_mps():
    """The stock Metal runtime has no avg_pool3d shim: a falling-back pool is kept out there."""
    x = torch.randn(1, 2, 6, 6, 6)
    node = _node(_Fn(_avg3d(3, 2)), x, op="aten.avg_pool3d.default")
    verdict = TargetCapabilities("mps").check_node(node)
    assert not verdict.supported and "aoti_torch_mps_avg_pool3d" in verdict.reason


def test_lstm_is_judged_by_the_layer_kernel_inductor_calls():
    lstm = nn.LSTM(8, 16, batch_first=True).eval()
    node = _node(lstm, torch.randn(2, 5, 8), op="aten.lstm.input")
    host = TargetCapabilities("host").check_node(node)
    assert host.supported and "aoti_torch_cpu_mkldnn_rnn_layer" in host.reason
    mps = TargetCapabilities("mps").check_node(node)  # no oneDNN there: matmuls instead
    assert "mkldnn" not in mps.reason
