"""Programs run by etmetal's runtime agree with eager PyTorch and with the stock runtime."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig
from executorch.exir._serialize._program import deserialize_pte_binary

from etmetal.runtime import Runtime


class Counter(torch.nn.Module):
    """A mutable buffer updated in place: state must persist across execute calls."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.arange(4.0))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.total.add_(x.sum(0))
        return self.lin(x).relu() + self.total


class ConvBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(self.bn(self.conv(x)).relu(), 2)
        return y.flatten(1).softmax(-1), y.mean((2, 3))


class CondModel(torch.nn.Module):
    def forward(self, x, y):
        return torch.cond(x.sum() > 0, lambda a, b: a * b + 1, lambda a, b: a - b, (x, y))


class MapModel(torch.nn.Module):
    def forward(self, xs, y):
        from torch._higher_order_ops.map import map as hop_map

        return hop_map(lambda x, y: x * y + y.sin(), xs, y)


class Dyn(torch.nn.Module):
    def forward(self, x, w):
        return (x @ w).view(-1).cumsum(0), x.shape[0] * 2


def _close(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        assert a == b


def test_mutable_buffer_persists_like_eager_and_stock(lower, stock):
    torch.manual_seed(1)
    eager = Counter().eval()
    x = torch.randn(3, 4)
    model = Counter().eval()
    model.load_state_dict(eager.state_dict())
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    # serialize the buffer's initial state (a mutable data segment) so it must be loaded
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["total"])])
    pte = lower(model, (x,), config=config)
    assert deserialize_pte_binary(pte).mutable_data
    method = Runtime.get().load_program(pte).load_method("forward")
    from executorch.runtime import Runtime as StockRuntime

    stock_method = StockRuntime.get().load_program(pte).load_method("forward")
    for step in range(3):
        xi = x * (step + 1)
        want = eager(xi)
        got = method.execute([xi])[0]
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got, stock_method.execute([xi])[0])


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_block_matches_eager_and_stock(lower, stock, etmetal, channels_last):
    model = ConvBlock().eval()
    x = torch.randn(2, 3, 8, 8)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    pte = lower(model, (x,))
    got = etmetal(pte, [x])
    for g, w in zip(got, model(x)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    if not channels_last:  # the stock portable batch norm rejects channels-last inputs
        for g, s in zip(got, stock(pte, [x])):
            torch.testing.assert_close(g, s, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_takes_the_right_branch(lower, stock, etmetal, sign):
    x, y = torch.rand(3, 4) * sign, torch.randn(3, 4)
    pte = lower(CondModel(), (x, y))
    program = deserialize_pte_binary(pte).program
    kinds = {type(i.instr_args).__name__ for i in program.execution_plan[0].chains[0].instructions}
    assert {"JumpFalseCall", "MoveCall"} <= kinds  # the program really branches and moves
    got = etmetal(pte, [x, y])
    _close(got[0], CondModel()(x, y))
    _close(got[0], stock(pte, [x, y])[0])


def test_map_loops_with_jumps_and_copy_index(lower, etmetal):
    xs, y = torch.randn(5, 3), torch.randn(3)
    pte = lower(MapModel(), (xs, y))
    got = etmetal(pte, [xs, y])
    _close(got[0], MapModel()(xs, y))


def test_dynamic_shapes_within_upper_bound(lower, stock):
    batch = torch.export.Dim("batch", min=1, max=8)
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    pte = lower(Dyn(), (x, w), dynamic_shapes=({0: batch}, None))
    method = Runtime.get().load_program(pte).load_method("forward")
    spec = method.metadata.input_specs[0].tensor
    assert spec.sizes == (8, 5) and spec.shape_dynamism.name == "DYNAMIC_BOUND"
    for n in (1, 8, 3):
        xi = torch.randn(n, 5)
        got = method.execute([xi, w])
        _close(got[0], Dyn()(xi, w)[0])
        _close(got[0], stock(pte, [xi, w])[0])
    from etmetal.runtime import InputError

    with pytest.raises(InputError, match="upper bound"):
        method.execute([torch.randn(9, 5), w])


def test_multiple_methods(lower, etmetal):
    class A(torch.nn.Module):
        def forward(self, x):
            return x.exp()

    class B(torch.nn.Module):
        def forward(self, x, y):
            return torch.cat([x, y], 1).tanh()

    x, y = torch.randn(2, 3), torch.randn(2, 2)
    pte = lower({"forward": (A(), (x,)), "other": (B(), (x, y))})
    program = Runtime.get().load_program(pte)
    assert program.method_names == {"forward", "other"}
    _close(program.load_method("forward").execute([x])[0], x.exp())
    _close(program.load_method("other").execute([x, y])[0], torch.cat([x, y], 1).tanh())
    assert program.metadata("other").num_inputs() == 2


def _kernel_calls(plan, op_name):
    names = [f"{op.name}.{op.overload}" for op in plan.operators]
    if op_name not in names:
        return []
    index = names.index(op_name)
    return [
        i.instr_args
        for i in plan.chains[0].instructions
        if getattr(i.instr_args, "op_index", None) == index
    ]


@pytest.mark.parametrize("dynamic", [False, True])
def test_memory_view_aliases_planned_memory(lower, dynamic):
    class M(torch.nn.Module):
        def forward(self, x):
            return (x + 1).view(-1, 12) * 2

    x = torch.randn(2, 3, 4)
    shapes = ({0: torch.export.Dim("n", min=1, max=6)},) if dynamic else None
    config = ExecutorchBackendConfig(remove_view_copy=True)
    pte = lower(M(), (x,), dynamic_shapes=shapes, config=config)
    plan = deserialize_pte_binary(pte).program.execution_plan[0]
    method = Runtime.get().load_program(pte).load_method("forward")
    for n in (2, 5) if dynamic else (2,):
        xi = torch.randn(n, 3, 4)
        _close(method.execute([xi])[0], M()(xi))
    (add,) = _kernel_calls(plan, "aten::add.out")
    (mul,) = _kernel_calls(plan, "aten::mul.out")
    add_out, mul_in = method._vals[add.args[-1]], method._vals[mul.args[0]]
    if dynamic:  # the view is an et_view instruction
        (view,) = _kernel_calls(plan, "executorch_prim::et_view.default")
        assert method._vals[view.args[-1]] is mul_in
    else:  # the view is two values the planner put at one offset
        assert not _kernel_calls(plan, "executorch_prim::et_view.default")
    assert mul_in.dim() == 2 and add_out.dim() == 3
    assert mul_in.data_ptr() == add_out.data_ptr()  # a real alias, not a copy


def test_tensors_planned_at_the_same_offset_share_memory(lower):
    class Chain(torch.nn.Module):
        def forward(self, x):
            a = x.sin()
            b = a.cos()
            c = b.exp()
            return c.tanh()

    pte = lower(Chain(), (torch.randn(16),))
    plan = deserialize_pte_binary(pte).program.execution_plan[0]
    method = Runtime.get().load_program(pte).load_method("forward")
    by_place: dict[tuple[int, int], list[int]] = {}
    for i, v in enumerate(plan.values):
        a = getattr(v.val, "allocation_info", None)
        if a is not None:
            by_place.setdefault((a.memory_id, a.memory_offset), []).append(i)
    shared = [ids for ids in by_place.values() if len(ids) > 1]
    assert shared, "the planner reused no memory in this chain"
    for ids in shared:
        assert len({method._vals[i].data_ptr() for i in ids}) == 1
    _close(method.execute([torch.ones(16)])[0], Chain()(torch.ones(16)))


def test_external_constants_from_ptd(lower, tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 2)
    ).eval()
    x = torch.randn(3, 6)
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, (x,))
    manager = to_edge_transform_and_lower(ep).to_executorch(
        ExecutorchBackendConfig(external_constants=True)
    )
    (tmp_path / "m.pte").write_bytes(manager.buffer)
    manager.write_tensor_data_to_file(str(tmp_path))
    ptds = sorted(tmp_path.glob("*.ptd"))
    assert ptds
    from etmetal.runtime import InvalidProgramError

    with pytest.raises(InvalidProgramError, match="data file"):
        Runtime.get().load_program(tmp_path / "m.pte").load_method("forward")
    program = Runtime.get().load_program(tmp_path / "m.pte", data_files=ptds)
    _close(program.load_method("forward").execute([x])[0], model(x))


def test_scalar_inputs_must_match_the_traced_value(lower):
    class M(torch.nn.Module):
        def forward(self, x, k: int):
            return x * k

    x = torch.randn(3)
    pte = lower(M(), (x, 3))
    method = Runtime.get().load_program(pte).load_method("forward")
    _close(method.execute([x, 3])[0], x * 3)
    from etmetal.runtime import InputError

    with pytest.raises(InputError, match="traced as 3"):
        method.execute([x, 4])
    with pytest.raises(InputError, match="dtype"):
        method.execute([x.double(), 3])


def test_quantized_decomposed_program_matches_stock_and_reference(lower, stock, etmetal):
    import executorch.kernels.quantized  # noqa: F401  (out variants the lowering needs)
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 5)
    ).eval()
    x = torch.randn(2, 3, 6, 6)
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    prepared(x)
    converted = convert_pt2e(prepared)
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(
        torch.export.export(converted, (x,)),
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    pte = edge.to_executorch().buffer
    names = {
        f"{o.name}.{o.overload}"
        for o in deserialize_pte_binary(pte).program.execution_plan[0].operators
    }
    assert "quantized_decomposed::dequantize_per_channel.out" in names
    got = etmetal(pte, [x])[0]
    torch.testing.assert_close(got, converted(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(got, stock(pte, [x])[0], rtol=0, atol=0)
