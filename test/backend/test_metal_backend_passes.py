"""The AOTI-side graph rewrites of MetalBackend.preprocess, checked by running the
graph before and after on the same inputs (eager ATen is the reference)."""

from __future__ import annotations

import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  (defines dim_order_ops)
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from etmetal.backend.passes.dim_order_to_aten_pass import DimOrderToAtenPass
from etmetal.backend.passes.replace_view_copy_with_view_pass import ReplaceViewCopyWithViewPass

aten = torch.ops.aten


def safe_view(x):
    y = aten.slice_copy.Tensor(x * 1.0, 1, 0, 2)
    return (y * 2.0,)


def result_mutated(x):
    t = x * 1.0
    y = aten.slice_copy.Tensor(t, 1, 0, 2)
    aten.add_.Tensor(y, 1.0)  # a view would write into t
    return (t, y)


def source_mutated_later(x):
    t = x * 1.0
    y = aten.select_copy.int(t, 0, 0)
    aten.mul_.Tensor(t, 3.0)  # a view would see the new values
    return (y + 0.0, t)


def output_of_input(x):
    return (aten.slice_copy.Tensor(x, 0, 1, 3),)  # a view would alias the caller's tensor


def split_piece_mutated(x):
    t = x * 1.0
    a, b = aten.split_copy.Tensor(t, 2, 1)
    aten.add_.Tensor(a, 5.0)
    return (a, b, t)


def view_of_view(x):
    t = x + 1.0
    y = aten.view_copy.default(t, [-1])
    return (aten.slice_copy.Tensor(y, 0, 2, 6) * 2.0,)


def layout_views(x):
    t = x + 1.0
    p = aten.permute_copy.default(t, [1, 0])
    e = aten.expand_copy.default(aten.unsqueeze_copy.default(p, 0), [2, 4, 4])
    return (aten.transpose_copy.int(e, 1, 2) * 2.0, aten.squeeze_copy.dims(e[:1], [0]) + 0.0)


def unbind_piece_mutated(x):
    t = x * 1.0
    a, b, c, d = aten.unbind_copy.int(t, 0)
    aten.mul_.Tensor(b, -1.0)  # a view would write into t
    return (a, b, t)


def transposed_then_written(x):
    t = x * 1.0
    y = aten.t_copy.default(t)
    aten.add_.Tensor(t, 1.0)  # a view would see it
    return (y + 0.0,)


CASES = [
    (safe_view, 1, 0),
    (layout_views, 5, 0),
    (unbind_piece_mutated, 0, 1),
    (transposed_then_written, 0, 1),
    (result_mutated, 0, 1),
    (source_mutated_later, 0, 1),
    (output_of_input, 0, 1),
    (split_piece_mutated, 0, 1),
    (view_of_view, 2, 0),
]


@pytest.mark.parametrize(("fn", "views", "copies"), CASES, ids=[c[0].__name__ for c in CASES])
def test_view_rewrite_keeps_copy_semantics(fn, views, copies):
    x = torch.randn(4, 4)
    reference = make_fx(fn)(x)
    rewritten = make_fx(fn)(x)
    rewrite = ReplaceViewCopyWithViewPass()
    result = rewrite(rewritten)
    assert result.graph_module is rewritten and result.modified == (views + copies > 0)
    assert (rewrite.as_view, rewrite.as_copy) == (views, copies)
    remaining = [n.target for n in rewritten.graph.nodes if "_copy" in str(n.target)]
    assert remaining == [], "every view copy is rewritten (Inductor has no lowering for them)"
    x_ref, x_new = x.clone(), x.clone()
    for got, want in zip(rewritten(x_new), reference(x_ref)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(x_new, x_ref, rtol=0, atol=0)  # the input is untouched


def test_view_of_a_mutated_program_input_stays_a_copy():
    def read_buffer(buf, x):
        return (aten.slice_copy.Tensor(buf, 0, 0, 2) * 1.0 + x,)

    gm = make_fx(read_buffer)(torch.randn(4, 3), torch.randn(2, 3))
    buf_name = next(n.name for n in gm.graph.nodes if n.op == "placeholder")
    rewrite = ReplaceViewCopyWithViewPass(mutated_inputs={buf_name})
    assert rewrite(gm).modified
    assert (rewrite.as_view, rewrite.as_copy) == (0, 1)


def dim_order_graph(op, x: torch.Tensor, **kwargs) -> torch.fx.GraphModule:
    """x -> op(x, **kwargs), built by hand (tracing would decompose the op)."""
    graph = torch.fx.Graph()
    inp = graph.placeholder("x")
    node = graph.call_function(op, (inp,), kwargs)
    node.meta["val"] = op(x, **kwargs)
    graph.output((node,))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize(
    ("dim_order", "fmt"),
    [([0, 1, 2, 3], torch.contiguous_format), ([0, 2, 3, 1], torch.channels_last)],
)
def test_dim_order_copy_becomes_to_copy_with_the_same_layout(dim_order, fmt):
    x = torch.randn(2, 3, 4, 5)
    op = torch.ops.dim_order_ops._to_dim_order_copy.default
    gm = dim_order_graph(op, x, dtype=torch.float16, dim_order=dim_order)
    want = gm(x)[0]
    pass_ = DimOrderToAtenPass()
    result = pass_(gm)
    assert result.modified and result.graph_module is gm and pass_.rewritten == 1
    [node] = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert node.target is aten._to_copy.default and node.kwargs["memory_format"] == fmt
    got = gm(x)[0]
    assert got.dtype == want.dtype and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dim_order_pass_leaves_a_graph_without_dim_order_ops_unmodified():
    x = torch.randn(2, 3)
    gm = dim_order_graph(aten.clone.default, x)
    pass_ = DimOrderToAtenPass()
    assert not pass_(gm).modified and pass_.rewritten == 0
    [node] = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert node.target is aten.clone.default
