"""Custom operators at the partitioner: the ones with a named shim (torchao's int4 linear,
``metal::gather_qmv``, ``metal::gated_delta_rule``, which mutates its state) are delegated
with their shim as the predicted fallback; a custom op without one is kept out, named."""

from __future__ import annotations

import torch
from executorch.exir import to_edge

from etmetal.backend.metal_partitioner import MetalPartitioner
from etmetal.examples.metal_registry import get_model_and_inputs

# a mutating custom operator no runtime has a shim for
_LIB = torch.library.Library("etmetal_test", "FRAGMENT")
_LIB.define("scale_(Tensor(a!) x, float s) -> ()")


@torch.library.impl(_LIB, "scale_", "CompositeExplicitAutograd")
def _scale_(x, s):
    x.mul_(s)


class _Mutating(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.ones(4))

    def forward(self, x):
        torch.ops.etmetal_test.scale_(self.acc, 2.0)
        return x + self.acc


def _verdicts(module, inputs, target):
    with torch.no_grad():
        ep = to_edge(torch.export.export(module, inputs)).exported_program()
    caps = MetalPartitioner(target=target).capabilities
    return {
        str(n.target): caps.check_node(n)
        for n in ep.graph.nodes
        if n.op == "call_function" and "getitem" not in str(n.target)
    }


def test_custom_ops_with_a_named_shim_are_delegated():
    for name, shim in (
        ("linear_nobias_int4", "aoti_torch_cpu__linear_fp_act_4bit_weight"),
        ("gather_qmv", "aoti_torch_cpu_gather_qmv"),
        ("gated_delta_rule", "aoti_torch_cpu_gated_delta_rule"),
    ):
        verdicts = _verdicts(*get_model_and_inputs(name), target="host")
        assert all(v.supported for v in verdicts.values()), (name, verdicts)
        assert [k for v in verdicts.values() for k in v.kernels] == [shim]


def test_the_mutating_custom_op_gets_the_mps_shim_on_mps_emulated():
    verdicts = _verdicts(*get_model_and_inputs("gated_delta_rule"), target="mps_emulated")
    assert [k for v in verdicts.values() for k in v.kernels] == ["aoti_torch_mps_gated_delta_rule"]


def test_a_mutating_custom_op_without_a_shim_is_kept_out_with_its_name():
    verdicts = _verdicts(_Mutating(), (torch.randn(4),), target="host")
    [wrapped] = [v for k, v in verdicts.items() if "auto_functionalized" in k]
    assert not wrapped.supported
    assert "etmetal_test.scale_" in wrapped.reason
    assert "aoti_torch_cpu_scale_" in wrapped.reason
