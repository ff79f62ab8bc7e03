"""The emulated Metal target's lowering gaps of issue #27, each on a minimal module lowered
for ``mps_emulated`` and run by etmetal's runtime against eager PyTorch:

- an unmasked eager attention (``matmul(q, k^T) * scale -> softmax -> matmul(v)``), which
  Inductor's attention fusion rewrites into a call of the ``scaled_dot_product_attention``
  overload packet;
- a conv1d over a transposed (non-contiguous) input, whose fake kernel needs an MPS build;
- the scans (``cumsum``, ...) and the pools Inductor leaves to ATen, which etmetal's
  runtime serves as ``aoti_torch_mps_*`` fallbacks in programs lowered with
  ``runtime="etmetal"``;
- a ``Tensor`` method on a fake ``mps`` tensor (circular padding's ``copy_``), whose
  binding's device guard needs an MPS build;
- ``index_select``, whose Inductor decomposition indexes with Python (``x[idx]``), which
  needs the same guard (found by the ``mps_emulated`` flow of the operator suite).
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from etmetal.backend.metal_partitioner import MetalPartitioner
from etmetal.backend.mps_decompositions import (
    MAC_MPS_DECOMPOSITIONS,
    MacMpsDecompositions,
    for_mps_tracing,
    with_overload_packets,
)
from etmetal.backend.mps_fake_impls import (
    NO_MPS_BUILD,
    aten_op_of_method,
    cpu_stand_ins,
    is_functional,
)
from etmetal.common.targets import METAL_DEVICE, MPS_EMULATED
from etmetal.layout.config import backend_config
from etmetal.runtime import Runtime

aten = torch.ops.aten
TARGET = MPS_EMULATED.name


# cumsum is core ATen; the others reach a backend only when the user keeps them
_NOT_CORE = [aten.cumprod.default, aten.logcumsumexp.default, aten.cummax.default]
_NOT_CORE.append(aten.cummin.default)


def _lower(module: nn.Module, inputs: tuple, runtime: str | None = "etmetal"):
    partitioner = MetalPartitioner(target=TARGET, runtime=runtime)
    with torch.no_grad():
        ep = torch.export.export(module, inputs)
    config = EdgeCompileConfig(_core_aten_ops_exception_list=_NOT_CORE)
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner], compile_config=config)
    return edge.to_executorch(backend_config()), partitioner


def _execute(pte: bytes, inputs: tuple) -> list[torch.Tensor]:
    method = Runtime.get().load_program(pte, trust_native_code=True).load_method("forward")
    try:
        return method.execute(list(inputs))
    finally:
        method.destroy()


def _eager(module: nn.Module, inputs: tuple) -> list[torch.Tensor]:
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


# -- 1. attention through the overload packet ------------------------------------------
class EagerAttention(nn.Module):
    """HF's ``eager`` attention without a mask, as speech and vision encoders write it."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        weights = torch.matmul(q, k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
        return torch.matmul(weights.softmax(dim=-1), v)


def test_every_decomposed_overload_is_also_matched_by_its_packet():
    overloads = [k for k in MAC_MPS_DECOMPOSITIONS if isinstance(k, torch._ops.OpOverload)]
    assert overloads
    for op in overloads:
        assert MAC_MPS_DECOMPOSITIONS[op.overloadpacket] is MAC_MPS_DECOMPOSITIONS[op]


def test_packets_are_derived_for_new_entries_and_never_guessed():
    def first(*a, **k):
        return NotImplemented

    def second(*a, **k):
        return NotImplemented

    table = with_overload_packets({aten.add.Tensor: first, aten.cumsum.default: first})
    assert table[aten.add] is first and table[aten.cumsum] is first
    explicit = with_overload_packets({aten.add.Tensor: first, aten.add: second})
    assert explicit[aten.add] is second
    with pytest.raises(ValueError, match="aten.add"):
        with_overload_packets({aten.add.Tensor: first, aten.add.Scalar: second})


def test_a_packet_call_on_fake_mps_becomes_the_metal_math_fallback():
    # what Inductor's fuse_attention replacement does: aten.scaled_dot_product_attention(...)
    with FakeTensorMode(), MacMpsDecompositions():
        q = torch.empty(1, 2, 6, 8, device=METAL_DEVICE)
        out = aten.scaled_dot_product_attention(q, q, q, scale=0.5)
    assert out.shape == (1, 2, 6, 8) and out.device.type == METAL_DEVICE


def _check_one_delegate_matches_eager(module: nn.Module, inputs: tuple) -> None:
    """Lowered for the emulated target, the whole module is one delegate and its output,
    run by etmetal's runtime, is eager's."""
    program, partitioner = _lower(module, inputs)
    report = partitioner.reports[-1]
    assert not report.kept_out and len(report.partitions) == 1, report.text()
    (got,) = _execute(program.buffer, inputs)
    torch.testing.assert_close(got, _eager(module, inputs)[0], atol=1e-5, rtol=1e-5)


def test_unmasked_eager_attention_lowers_and_matches_eager():
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(1, 2, 6, 8, generator=gen) for _ in range(3))
    module = EagerAttention().eval()
    _check_one_delegate_matches_eager(module, inputs)


# -- 2. conv1d over a transposed input ----------------------------------------------------
class TransposedConv1d(nn.Module):
    """A speech model's positional conv: (batch, time, channels) -> conv over time."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 8, kernel_size=5, padding=2, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


def _fake_conv1d_of_a_transposed_input(mode: FakeTensorMode, device: str) -> torch.Tensor:
    with mode:
        x = torch.empty(2, 10, 8, device=device).transpose(1, 2)
        w = torch.empty(8, 4, 5, device=device)
        return aten.convolution.default(x, w, None, [1], [2], [1], False, [0], 2)


def test_the_fake_conv_needs_an_mps_build_without_the_stand_ins():
    if torch.backends.mps.is_built():
        pytest.skip("a macOS build runs the fake conv on mps itself")
    with pytest.raises(RuntimeError, match=NO_MPS_BUILD):
        _fake_conv1d_of_a_transposed_input(FakeTensorMode(), METAL_DEVICE)


def test_cpu_stand_ins_give_the_fake_conv_the_cpu_geometry_on_mps():
    want = _fake_conv1d_of_a_transposed_input(FakeTensorMode(), "cpu")
    with cpu_stand_ins():
        got = _fake_conv1d_of_a_transposed_input(FakeTensorMode(), METAL_DEVICE)
    assert got.device.type == METAL_DEVICE
    assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)


def test_cpu_stand_ins_are_only_for_functional_ops_and_are_undone():
    from torch._subclasses import fake_impls

    assert is_functional(aten.convolution.default)
    assert not is_functional(aten.copy_.default) and not is_functional(aten.view.default)
    before = dict(fake_impls.op_implementations_dict)
    with cpu_stand_ins():
        table = fake_impls.op_implementations_dict
        assert table[aten.copy_.default] is before[aten.copy_.default]
        assert table[aten.convolution.default] is not before[aten.convolution.default]
    assert fake_impls.op_implementations_dict == before


def test_conv1d_over_a_transposed_input_lowers_and_matches_eager():
    torch.manual_seed(0)
    module = TransposedConv1d().eval()
    inputs = (torch.randn(2, 10, 8),)
    _check_one_delegate_matches_eager(module, inputs)


# -- 3. scans as emulated fallbacks -------------------------------------------------------
class Scans(nn.Module):
    """Every scan Inductor leaves to a C-shim fallback on mps."""

    def forward(self, mask: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        top, top_at = x.cummax(-1)
        low, low_at = x.cummin(0)
        return mask.cumsum(-1), x.cumprod(-1), x.logcumsumexp(-1), top, top_at, low, low_at


def _check_emulated_fallbacks_match_eager(module: nn.Module, inputs: tuple, ops) -> None:
    """Lowered with ``runtime="etmetal"``, ``module`` is one delegate that calls each of
    ``ops`` as an ``aoti_torch_mps_*`` fallback, and every output is eager's."""
    program, partitioner = _lower(module, inputs)
    report = partitioner.reports[-1]
    assert not report.kept_out and len(report.partitions) == 1, report.text()
    fallbacks = set(report.partitions[0].fallbacks)
    for op in ops:
        assert f"aoti_torch_mps_{op}" in fallbacks, report.text()
    got = _execute(program.buffer, inputs)
    want = _eager(module, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_scans_run_as_emulated_fallbacks_on_the_etmetal_runtime():
    gen = torch.Generator().manual_seed(0)
    inputs = (torch.randint(0, 2, (2, 7), generator=gen), torch.randn(3, 7, generator=gen))
    scans = ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")
    _check_emulated_fallbacks_match_eager(Scans().eval(), inputs, scans)


class PositionIds(nn.Module):
    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        return mask.cumsum(-1)


def test_scans_stay_out_for_a_macs_runtime():
    # a Mac's Metal runtime has no aoti_torch_mps_cumsum: the default runtime keeps it out
    inputs = (torch.ones(1, 5, dtype=torch.int64),)
    _, partitioner = _lower(PositionIds().eval(), inputs, runtime=None)
    reasons = partitioner.reports[-1].reasons()
    reason = reasons.get("aten.cumsum.default", "")
    assert "aoti_torch_mps_cumsum" in reason and "runtime='etmetal'" in reason, reasons


# -- 4. Tensor methods whose binding needs an MPS device guard ----------------------------
def _fake_scatter_by_copy(mode: FakeTensorMode) -> tuple[torch.Tensor, torch.Tensor]:
    # Inductor's re-inplacing pass checks a slice_scatter this way (circular padding)
    with mode:
        padded = torch.empty(2, 3, 8, 6, device=METAL_DEVICE)
        src = torch.empty_strided((2, 3, 6, 6), (162, 54, 9, 1), device=METAL_DEVICE)
        window = aten.slice.Tensor(padded, 2, 1, 7)
        return window, window.copy_(src)


def test_a_tensor_method_on_fake_mps_needs_an_mps_build_without_the_mode():
    if torch.backends.mps.is_built():
        pytest.skip("a macOS build has an mps device guard")
    with pytest.raises(RuntimeError, match=NO_MPS_BUILD):
        _fake_scatter_by_copy(FakeTensorMode())


def test_tensor_methods_go_through_the_dispatcher_under_the_stand_ins():
    assert aten_op_of_method(torch.Tensor.copy_) is aten.copy_
    assert aten_op_of_method(torch.cat) is None  # not a Tensor method
    with cpu_stand_ins():
        window, copied = _fake_scatter_by_copy(FakeTensorMode())
    assert copied is window  # the in-place result is the tensor itself, as eager's
    assert copied.device.type == METAL_DEVICE and copied.shape == (2, 3, 6, 6)


@pytest.mark.parametrize("mode", ["circular", "reflect"])
def test_padded_convolution_lowers_and_matches_eager(mode):
    torch.manual_seed(0)
    module = nn.Conv2d(3, 4, 3, padding=1, padding_mode=mode).eval()
    _check_one_delegate_matches_eager(module, (torch.randn(2, 3, 9, 7),))


# -- 5. pools as emulated fallbacks ------------------------------------------------------
class Pools(nn.Module):
    """Pools Inductor leaves to a C-shim fallback on mps (an adaptive pool whose windows
    overlap unevenly, an average over windows too large to unroll), beside a max pool it
    generates Metal code for."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        uneven = nn.functional.adaptive_avg_pool2d(x, (5, 3))
        wide = nn.functional.avg_pool2d(x, 7, stride=2)
        top, top_at = nn.functional.max_pool2d(x, 7, stride=2, return_indices=True)
        return uneven, wide, top, top_at


_POOL_FALLBACKS = ("_adaptive_avg_pool2d", "avg_pool2d")


def test_pools_run_as_emulated_fallbacks_on_the_etmetal_runtime():
    inputs = (torch.randn(2, 3, 40, 37, generator=torch.Generator().manual_seed(0)),)
    _check_emulated_fallbacks_match_eager(Pools().eval(), inputs, _POOL_FALLBACKS)


def test_pools_stay_out_for_a_macs_runtime():
    inputs = (torch.randn(1, 2, 11, 9),)
    module = nn.AdaptiveAvgPool2d((5, 3)).eval()
    _, partitioner = _lower(module, inputs, runtime=None)
    reason = partitioner.reports[-1].reasons().get("aten._adaptive_avg_pool2d.default", "")
    assert "aoti_torch_mps__adaptive_avg_pool2d" in reason and "runtime='etmetal'" in reason


# -- 6. decompositions that index with Python ---------------------------------------------
def _fake_index_select(table: dict, dim: int, index_shape: tuple) -> torch.Tensor:
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    with mode:
        x = torch.empty(3, 5, 4, device=METAL_DEVICE)
        index = torch.zeros(index_shape, dtype=torch.long, device=METAL_DEVICE)
    fn = lambda x, index: aten.index_select.default(x, dim, index)  # noqa: E731
    return make_fx(fn, decomposition_table=table, tracing_mode="fake")(x, index)


def test_inductors_index_select_needs_an_mps_build_without_the_mps_table():
    from torch._inductor.decomposition import select_decomp_table

    if torch.backends.mps.is_built():
        pytest.skip("a macOS build indexes fake mps tensors itself")
    with pytest.raises(RuntimeError, match=NO_MPS_BUILD):
        _fake_index_select(select_decomp_table(), 1, (2,))


@pytest.mark.parametrize("dim, index_shape", [(1, (2,)), (-1, ())])
def test_the_mps_table_traces_index_select_to_the_indexing_a_mac_traces(dim, index_shape):
    from torch._inductor.decomposition import select_decomp_table

    gm = _fake_index_select(for_mps_tracing(select_decomp_table()), dim, index_shape)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.index.Tensor in ops and aten.index_select.default not in ops
    out = gm.graph.output_node().args[0].meta["val"]
    want = torch.empty(3, 5, 4).index_select(dim, torch.zeros(index_shape, dtype=torch.long))
    assert out.shape == want.shape and out.stride() == want.stride()
    assert out.device.type == METAL_DEVICE


class IndexSelects(nn.Module):
    """Rows picked by a 1-D index and one column by a 0-D index, as an embedding lookup
    or a gather of heads writes them."""

    def forward(self, x: torch.Tensor, rows: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        picked = torch.index_select(x, 1, rows)
        return picked * 2 + torch.index_select(x, -1, col)[:, : rows.shape[0]]


def test_index_select_lowers_and_matches_eager():
    gen = torch.Generator().manual_seed(0)
    inputs = (torch.randn(3, 5, 4, generator=gen), torch.tensor([4, 0, 2, 2]), torch.tensor(3))
    _check_one_delegate_matches_eager(IndexSelects().eval(), inputs)
