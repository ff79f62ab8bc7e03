"""The FVP test runner's facts that the Cortex-M host run reproduces
(:mod:`etmetal.testing.cortex_m_fvp`), checked against programs lowered here and, for the
named host/device difference, against ExecuTorch's own runtime with its portable kernels."""

from __future__ import annotations

import pytest
import torch

from etmetal.testing import cortex_m_fvp


def _pte(module: torch.nn.Module, inputs: tuple) -> bytes:
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(module.eval(), inputs, strict=False)
    return to_edge_transform_and_lower(ep).to_executorch().buffer


class _Div(torch.nn.Module):
    def forward(self, a, b):
        return a / b


class _Add(torch.nn.Module):
    def forward(self, a, b):
        return a + b


def test_a_program_outside_the_runner_kernels_is_refused_naming_the_operator():
    inputs = (torch.rand(1, 4) + 1, torch.rand(2, 1, 4) + 1)  # a broadcasting division
    names = cortex_m_fvp.operator_names(_pte(_Div(), inputs))
    assert names == ["aten::div.out"]
    with pytest.raises(cortex_m_fvp.RunnerKernelMissing, match=r"no kernel for aten::div\.out"):
        cortex_m_fvp.check_runner_kernels(names)


def test_a_program_inside_the_runner_kernels_is_accepted():
    inputs = (torch.rand(1, 4), torch.rand(2, 1, 4))
    names = cortex_m_fvp.operator_names(_pte(_Add(), inputs))
    assert names == ["aten::add.out"]
    cortex_m_fvp.check_runner_kernels(names)  # the runner links aten::add.out
    cortex_m_fvp.check_runner_kernels([])
    with pytest.raises(cortex_m_fvp.RunnerKernelMissing, match="aten::_softmax.out"):
        cortex_m_fvp.check_runner_kernels(["aten::add.out", "aten::_softmax.out"])


def test_conv3d_difference_holds_for_the_portable_kernel():
    """The reason given for conv3d: the stock runtime's portable convolution refuses a 5-D
    input, while etmetal's runtime runs the same program and matches eager."""
    from executorch.runtime import Runtime as StockRuntime

    from etmetal.runtime import Runtime

    conv = torch.nn.Conv3d(2, 3, 2).eval()
    x = torch.randn(1, 2, 4, 4, 4)
    pte = _pte(conv, (x,))
    assert cortex_m_fvp.operator_names(pte) == ["aten::convolution.out"]
    cortex_m_fvp.check_runner_kernels(["aten::convolution.out"])  # in the runner's set
    with pytest.raises(RuntimeError):
        StockRuntime.get().load_program(pte).load_method("forward").execute([x])
    got = Runtime.get().load_program(pte).load_method("forward").execute([x])
    with torch.no_grad():
        torch.testing.assert_close(got[0], conv(x))


@pytest.mark.parametrize(
    "nodeid, named",
    [
        ("ops/test_conv.py::test_implementation_conv2d[cortex-m55-conv3d]", True),
        ("test_conv.py::test_implementation_conv2d[cortex-m85-conv3d]", True),
        ("ops/test_conv.py::test_implementation_conv2d[cortex-m55-conv3d_big]", False),
        ("ops/test_conv.py::test_dialect_conv2d[cortex-m55-conv3d]", False),
        ("ops/test_conv.py::test_implementation_conv2d[cortex-m55-conv1d]", False),
        ("ops/test_div.py::test_implementation_div[cortex-m55-broadcast_1]", False),
    ],
)
def test_host_differences_match_their_case_only(nodeid, named):
    assert (cortex_m_fvp.host_difference(nodeid) is not None) == named
