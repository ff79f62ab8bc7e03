"""LegalizeDimOrdersPass in etmetal.backend_config(): the two failures of issue 14 (a
view mid-way through a channels-last graph, ``clone`` with ``_skip_dim_order=True``),
kernels that accept channels-last labels but compute wrong values, the minimal number of
conversions, contiguous programs left alone, and refusals that name the node."""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.passes.spec_prop_pass import SpecPropPass
from torch import nn

from etmetal.layout.layout_safe_view_copy_pass import LayoutSafeViewCopyPass
from etmetal.layout.legalize_dim_orders_pass import (
    LegalizeDimOrdersPass,
    StockKernelLayoutError,
    same_memory,
)
from etmetal.testing.layout_property import conversions_added
from etmetal.testing.view_copy_matrix import (
    kernel_calls,
    lower,
    run_on_stock_runtime,
    to_edge_for,
)

CL = torch.channels_last
TO_DIM_ORDER = exir_ops.edge.dim_order_ops._to_dim_order_copy.default
CONFIGS = [(skip, rvc) for skip in (False, True) for rvc in (False, True)]


class _ViewBetweenConvs(nn.Module):
    """The issue's second failure: a channel split between two channels-last convs."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c1(x)
        return self.c2(y.reshape(y.shape[0], 4, 2 * y.shape[2], y.shape[3]))


def _channels_last_case():
    torch.manual_seed(0)
    model = _ViewBetweenConvs().eval().to(memory_format=CL)
    x = torch.randn(2, 4, 6, 6).to(memory_format=CL)
    return model, x


def _edge(model: nn.Module, x: torch.Tensor, skip: bool):
    return to_edge_for(torch.export.export(model, (x,)), skip_dim_order=skip)


@pytest.mark.parametrize("skip, rvc", CONFIGS)
def test_view_between_channels_last_convs_runs_on_the_stock_runtime(skip, rvc):
    model, x = _channels_last_case()
    expected = model(x).detach()
    edge = _edge(model, x, skip)
    stock = lower(edge, remove_view_copy=rvc, lowering="stock")
    with pytest.raises(RuntimeError, match=r"0x12 in aten::(convolution|clone)"):
        run_on_stock_runtime(stock.buffer, [x])  # the defect, measured without etmetal
    mine = lower(edge, remove_view_copy=rvc, lowering="etmetal")
    (out,) = run_on_stock_runtime(mine.buffer, [x])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    # one tensor must change layout (the view's row-major result meets a conv whose other
    # tensors are channels-last); the lowering adds no more than that one conversion
    assert conversions_added(edge.exported_program().graph, mine) <= 1
    # with _skip_dim_order the model's .contiguous() (a clone the stock kernel refuses)
    # runs as the conversion the stock runtime accepts
    assert kernel_calls(mine, "aten::clone") == 0


class _Broadcasts(nn.Module):
    """Kernels that take channels-last labels but read a broadcast operand row-major."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(dim=(2, 3), keepdim=True)) * torch.sigmoid(x[:, :1])


@pytest.mark.parametrize("skip", [False, True])
def test_broadcasting_on_channels_last_is_right(skip):
    x = torch.randn(2, 4, 5, 3).to(memory_format=CL)
    model = _Broadcasts()
    manager = lower(_edge(model, x, skip), remove_view_copy=True, lowering="etmetal")
    (out,) = run_on_stock_runtime(manager.buffer, [x])
    torch.testing.assert_close(out, model(x), rtol=0, atol=1e-5)


class _Layouts(nn.Module):
    """permute, slice, cat and pad of a channels-last tensor, ending in one channel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([x[:, :, 1:], x.transpose(2, 3)[:, :, :3]], dim=2)
        return self.conv(torch.nn.functional.pad(y, (1, 0)))


@pytest.mark.parametrize("skip", [False, True])
def test_data_movement_on_channels_last_is_right(skip):
    x = torch.randn(1, 3, 4, 4).to(memory_format=CL)
    model = _Layouts().eval().to(memory_format=CL)
    manager = lower(_edge(model, x, skip), remove_view_copy=True, lowering="etmetal")
    (out,) = run_on_stock_runtime(manager.buffer, [x])
    torch.testing.assert_close(out, model(x).detach(), rtol=0, atol=1e-5)


def _legalized(model: nn.Module, x: torch.Tensor, skip: bool = False):
    gm = copy.deepcopy(_edge(model, x, skip).exported_program().graph_module)
    gm = SpecPropPass()(gm).graph_module
    LayoutSafeViewCopyPass()(gm)
    return gm


def test_contiguous_program_is_left_unchanged():
    torch.manual_seed(0)
    model = _ViewBetweenConvs().eval()
    gm = _legalized(model, torch.randn(1, 4, 6, 6))
    before = [(n.name, n.target, n.args, dict(n.kwargs)) for n in gm.graph.nodes]
    pass_ = LegalizeDimOrdersPass()
    assert not pass_(gm).modified
    assert [(n.name, n.target, n.args, dict(n.kwargs)) for n in gm.graph.nodes] == before


def test_output_dim_order_is_kept():
    model, x = _channels_last_case()
    gm = _legalized(model, x)
    (out,) = gm.graph.output_node().args[0]
    declared = tuple(out.meta["spec"].dim_order)
    LegalizeDimOrdersPass()(gm)
    (out,) = gm.graph.output_node().args[0]
    assert tuple(out.meta["spec"].dim_order) == declared == (0, 2, 3, 1)


def test_undeclarable_output_dim_order_is_refused_naming_the_node():
    model, x = _channels_last_case()
    gm = _legalized(model, x)
    (out,) = gm.graph.output_node().args[0]
    # a dim order no stock kernel writes (neither default nor channels-last), declared
    # for the method's output: no conversion can produce it
    out.meta["spec"].dim_order = (0, 3, 1, 2)
    with pytest.raises(StockKernelLayoutError, match=rf"'{out.name}'.*tensors_have_same_dim"):
        LegalizeDimOrdersPass()(gm)


def test_same_memory_ignores_size_one_dims():
    assert same_memory([2, 1, 4, 4], (0, 2, 1, 3), (0, 1, 2, 3))
    assert same_memory([2, 1, 4, 4], (0, 2, 3, 1), (0, 1, 2, 3))
    assert not same_memory([2, 3, 4, 4], (0, 2, 3, 1), (0, 1, 2, 3))
