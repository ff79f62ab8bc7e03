"""LayoutSafeViewCopyPass and etmetal.backend_config(): graph rewrites, safety rules,
errors naming the node, and storage sharing of the views it keeps."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig, memory
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
from executorch.exir.passes.spec_prop_pass import SpecPropPass
from executorch.exir.schema import Tensor as SchemaTensor
from torch import nn

import etmetal
from etmetal.examples.view_copy import get_case
from etmetal.layout.layout_safe_view_copy_pass import (
    LayoutSafeViewCopyError,
    LayoutSafeViewCopyPass,
    is_view_copy,
)
from etmetal.layout.view_copy_then_sym_shape_eval_pass import ViewCopyThenSymShapeEvalPass
from etmetal.testing.view_copy_matrix import (
    eager_outputs,
    kernel_calls,
    lower,
    run_on_stock_runtime,
    to_edge_for,
)

TO_DIM_ORDER = exir_ops.edge.dim_order_ops._to_dim_order_copy.default


@functools.cache
def _edge(case_name: str, skip_dim_order: bool = False):
    return to_edge_for(get_case(case_name), skip_dim_order=skip_dim_order)


def _spec_propagated(case_name: str) -> torch.fx.GraphModule:
    """A fresh edge graph of the case with TensorSpecs, as the pass sees it in to_executorch."""
    gm = copy.deepcopy(_edge(case_name)).exported_program().graph_module
    return SpecPropPass()(gm).graph_module


def _nodes(gm: torch.fx.GraphModule, predicate) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and predicate(n)]


def _views(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return _nodes(gm, lambda n: n.target == memory.view)


# --- graph rewrites -------------------------------------------------------------------


def test_channels_last_base_is_converted_then_viewed():
    gm = _spec_propagated("patch_embed")
    (view_copy,) = _nodes(gm, is_view_copy)
    conv = view_copy.args[0]
    assert conv.meta["spec"].dim_order == (0, 2, 3, 1)  # the layout this test is about

    pass_ = LayoutSafeViewCopyPass()
    assert pass_(gm).modified
    (conversion,) = _nodes(gm, lambda n: n.target == TO_DIM_ORDER)
    assert conversion.args == (conv,) and conversion.kwargs["dim_order"] == [0, 1, 2, 3]
    assert conversion.meta["spec"].dim_order == (0, 1, 2, 3)
    assert tuple(conversion.meta["val"].shape) == tuple(conv.meta["val"].shape)
    (view,) = _views(gm)
    assert view is view_copy and view.args[0] is conversion
    assert not _nodes(gm, is_view_copy)
    assert pass_.stats == {"replaced": 1, "kept": 0, "legalized": 1}


def test_without_replacement_the_kept_view_copy_is_still_legalized():
    gm = _spec_propagated("patch_embed")
    LayoutSafeViewCopyPass(replace_views=False)(gm)
    (view_copy,) = _nodes(gm, is_view_copy)
    assert view_copy.args[0].target == TO_DIM_ORDER
    assert not _views(gm)


def test_etmetal_runtime_mode_keeps_view_copy_on_its_channels_last_input():
    gm = _spec_propagated("patch_embed")
    LayoutSafeViewCopyPass(legalize_for_stock_kernels=False)(gm)
    (view_copy,) = _nodes(gm, is_view_copy)
    assert view_copy.args[0].meta["spec"].dim_order == (0, 2, 3, 1)
    assert not _views(gm) and not _nodes(gm, lambda n: n.target == TO_DIM_ORDER)


def test_etmetal_runtime_mode_program_is_rejected_by_stock_kernels():
    # what legalize_for_stock_kernels is for: without it the stock view_copy.out refuses
    # the channels-last input, with it the same program runs
    case = get_case("patch_embed")
    edge = _edge("patch_embed")
    raw = copy.deepcopy(edge).to_executorch(
        etmetal.backend_config(legalize_for_stock_kernels=False)
    )
    with pytest.raises(RuntimeError, match=r"0x12 in aten::view_copy"):
        run_on_stock_runtime(raw.buffer, case.run_inputs())


def test_chained_views_collapse_onto_the_first_base():
    gm = _spec_propagated("contiguous")
    n_before = len(_nodes(gm, is_view_copy))
    LayoutSafeViewCopyPass()(gm)
    views = _views(gm)
    assert not _nodes(gm, is_view_copy)
    assert 0 < len(views) < n_before
    for view in views:
        assert view.args[0].target not in (memory.view,) and not is_view_copy(view.args[0])


# --- safety rules ----------------------------------------------------------------------


class _ViewIsOutput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).reshape(x.shape[0], -1)


def test_view_feeding_the_graph_output_stays_a_copy():
    edge = to_edge_for(
        torch.export.export(_ViewIsOutput(), (torch.randn(2, 3, 4),)), skip_dim_order=False
    )
    gm = SpecPropPass()(edge.exported_program().graph_module).graph_module
    LayoutSafeViewCopyPass()(gm)
    (view_copy,) = _nodes(gm, is_view_copy)
    assert any(user.op == "output" for user in view_copy.users)
    assert not _views(gm)


class _ChannelsLastViewIsOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(2)


@pytest.mark.parametrize("remove_view_copy", [False, True])
def test_channels_last_view_feeding_the_output_is_legalized_and_kept(remove_view_copy):
    model = _ChannelsLastViewIsOutput().eval()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    edge = to_edge_for(torch.export.export(model, (x,)), skip_dim_order=False)
    manager = lower(edge, remove_view_copy=remove_view_copy, lowering="etmetal")
    assert kernel_calls(manager, "aten::view_copy") == 1
    assert kernel_calls(manager, "dim_order_ops::_to_dim_order_copy") == 1
    (out,) = run_on_stock_runtime(manager.buffer, [x])
    torch.testing.assert_close(out, model(x).detach(), rtol=0, atol=1e-5)


def test_mutated_view_stays_a_copy_and_other_views_do_not():
    gm = _spec_propagated("contiguous")
    first, *others = _nodes(gm, is_view_copy)
    with gm.graph.inserting_after(first):
        gm.graph.call_function(torch.ops.aten.mul_.Scalar, (first, 2.0))
    LayoutSafeViewCopyPass()(gm)
    assert is_view_copy(first)
    assert _views(gm), "views of bases nobody writes to are still replaced"


class _BufferViewBeforeUpdate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.arange(12.0).reshape(2, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.state.reshape(3, 4) * x  # a view of the buffer, read before its update
        self.state.add_(1.0)
        return y


@pytest.mark.filterwarnings("ignore:Mutation on a buffer")  # the emitter's general notice
def test_view_of_a_mutated_buffer_stays_a_copy_and_runs_right():
    x = torch.randn(3, 4)
    edge = to_edge_for(torch.export.export(_BufferViewBeforeUpdate(), (x,)), skip_dim_order=False)
    # the buffer's initial value is serialized only when asked for; other passes given to
    # backend_config run as usual
    config = etmetal.backend_config(passes=[InitializedMutableBufferPass(["state"])])
    manager = edge.to_executorch(config)
    graph = manager.exported_program().graph
    copies = [n for n in graph.nodes if n.target == torch.ops.aten.copy_.default]
    assert copies, "the buffer write-back this test relies on"
    buffer = copies[0].args[0]
    assert not [u for u in buffer.users if u.target == memory.view]

    from executorch.runtime import Runtime

    method = Runtime.get().load_program(manager.buffer).load_method("forward")
    eager = _BufferViewBeforeUpdate()
    for _ in range(2):  # the second call sees the updated buffer
        torch.testing.assert_close(method.execute([x])[0], eager(x), rtol=0, atol=0)


# --- malformed graphs: the error names the node -------------------------------------------


def test_graph_without_specs_names_the_view_copy_node():
    gm = copy.deepcopy(_edge("patch_embed")).exported_program().graph_module  # no specs
    (view_copy,) = _nodes(gm, is_view_copy)
    with pytest.raises(LayoutSafeViewCopyError, match=rf"'{view_copy.name}'.*meta\['spec'\]"):
        LayoutSafeViewCopyPass()(gm)


def test_base_without_spec_names_the_base_and_its_view():
    gm = _spec_propagated("patch_embed")
    (view_copy,) = _nodes(gm, is_view_copy)
    base = view_copy.args[0]
    del base.meta["spec"]
    with pytest.raises(LayoutSafeViewCopyError) as info:
        LayoutSafeViewCopyPass()(gm)
    assert f"'{base.name}'" in str(info.value) and f"'{view_copy.name}'" in str(info.value)


@pytest.mark.parametrize("dim_order", [(0, 1, 1, 3), (0, 1, 2), (0, 1, 2, 3, 4), None, ("a",)])
def test_unknown_dim_order_names_the_node(dim_order):
    gm = _spec_propagated("patch_embed")
    (view_copy,) = _nodes(gm, is_view_copy)
    base = view_copy.args[0]
    base.meta["spec"].dim_order = dim_order
    with pytest.raises(LayoutSafeViewCopyError, match=rf"'{base.name}'.*unknown dim order"):
        LayoutSafeViewCopyPass()(gm)


def test_view_copy_without_fake_value_names_the_node():
    gm = _spec_propagated("contiguous")
    view_copy = _nodes(gm, is_view_copy)[0]
    del view_copy.meta["val"]
    with pytest.raises(LayoutSafeViewCopyError, match=rf"'{view_copy.name}'.*meta\['val'\]"):
        LayoutSafeViewCopyPass()(gm)


def test_base_without_fake_value_names_the_base_and_its_view():
    gm = _spec_propagated("patch_embed")
    (view_copy,) = _nodes(gm, is_view_copy)
    base = view_copy.args[0]
    del base.meta["val"]
    with pytest.raises(LayoutSafeViewCopyError, match=rf"'{base.name}'.*'{view_copy.name}'"):
        LayoutSafeViewCopyPass()(gm)
    assert not _nodes(gm, lambda n: n.target == TO_DIM_ORDER)


def test_malformed_graph_is_left_unchanged():
    gm = _spec_propagated("contiguous")
    *_, last = _nodes(gm, is_view_copy)
    last.meta["spec"].dim_order = (7,) * len(last.meta["spec"].shape)
    before = [(n.name, n.target) for n in gm.graph.nodes]
    with pytest.raises(LayoutSafeViewCopyError):
        LayoutSafeViewCopyPass()(gm)
    assert [(n.name, n.target) for n in gm.graph.nodes] == before


# --- backend_config wiring ------------------------------------------------------------


def test_backend_config_replaces_the_stock_pass_and_keeps_other_fields():
    config = etmetal.backend_config(emit_stacktrace=True)
    assert isinstance(config, ExecutorchBackendConfig)
    assert config.remove_view_copy is False  # the stock, layout-blind replacement is off
    assert config.emit_stacktrace is True
    wrapper = config.sym_shape_eval_pass
    assert isinstance(wrapper, ViewCopyThenSymShapeEvalPass)
    assert (
        wrapper.view_copy_pass.replace_views and wrapper.view_copy_pass.legalize_for_stock_kernels
    )


def test_backend_config_wraps_per_method_sym_shape_eval_passes():
    from executorch.exir.passes.sym_shape_eval_pass import HintBasedSymShapeEvalPass

    mine = HintBasedSymShapeEvalPass()
    config = etmetal.backend_config(sym_shape_eval_pass={"forward": mine})
    assert config.sym_shape_eval_pass["forward"].sym_shape_eval_pass is mine
    # a method the dict does not name gets the default pass, still after the lowering
    other = config.sym_shape_eval_pass.get("other", ExecutorchBackendConfig().sym_shape_eval_pass)
    assert isinstance(other, ViewCopyThenSymShapeEvalPass)


def test_backend_config_rejects_a_bad_sym_shape_eval_pass():
    with pytest.raises(TypeError, match="sym_shape_eval_pass"):
        etmetal.backend_config(sym_shape_eval_pass="nope")


# --- contiguous input: safe views are free ---------------------------------------------


def _allocation(tensor: SchemaTensor) -> tuple[int, int, int]:
    info = tensor.allocation_info
    assert info is not None, "tensor is not memory planned"
    return info.memory_id, info.memory_offset_low, info.memory_offset_high


def test_contiguous_views_share_their_base_storage():
    manager = lower(_edge("contiguous"), remove_view_copy=True, lowering="etmetal")
    graph = manager.exported_program().graph
    views = [n for n in graph.nodes if n.target == memory.view]
    assert len(views) == 3
    assert not [n for n in graph.nodes if n.op == "call_function" and "view_copy" in str(n.target)]
    assert kernel_calls(manager, "aten::view_copy") == 0

    # planned specs: each view's storage is its base's
    for view in views:
        spec, base_spec = view.meta["spec"], view.args[0].meta["spec"]
        assert base_spec.mem_id is not None and base_spec.mem_offset is not None
        assert (spec.mem_id, spec.mem_offset) == (base_spec.mem_id, base_spec.mem_offset)

    # the emitted program: a tensor of each view's shape sits at its base's allocation
    plan = manager.executorch_program.execution_plan[0]
    tensors = [v.val for v in plan.values if isinstance(v.val, SchemaTensor)]
    for view in views:
        view_shape = list(view.meta["spec"].shape)
        base_shape = list(view.args[0].meta["spec"].shape)
        base_allocs = {_allocation(t) for t in tensors if list(t.sizes) == base_shape}
        view_allocs = {_allocation(t) for t in tensors if list(t.sizes) == view_shape}
        assert base_allocs & view_allocs, f"{view.name} has no tensor sharing its base's memory"

    case = get_case("contiguous")
    inputs = case.run_inputs()
    outputs = run_on_stock_runtime(manager.buffer, inputs)
    torch.testing.assert_close(outputs[0], eager_outputs(case, inputs)[0], rtol=0, atol=1e-5)


def test_dynamic_contiguous_views_are_emitted_as_et_view():
    edge = to_edge_for(get_case("contiguous_dynamic"), skip_dim_order=False)
    manager = lower(edge, remove_view_copy=True, lowering="etmetal")
    assert kernel_calls(manager, "aten::view_copy") == 0
    assert kernel_calls(manager, "executorch_prim::et_view") == 3
