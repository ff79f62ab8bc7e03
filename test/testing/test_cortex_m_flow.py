"""The ``cortex_m_host`` backend-suite flow: upstream's Cortex-M stages, etmetal's run step,
and the cause analysis of output mismatches.

The cases drive the flow's tester the way the suite's ``run_test`` does (quantize with the
flow's stage, export, lower, ``to_executorch``, serialize, compare with the suite's
tolerances). The analysis is checked against ExecuTorch's Python reference kernels: a
faithful run is attributed to the lowered program, a corrupted one to the runtime.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tosa_serializer", reason="the cortex-m extra (tosa-tools) is not installed")

from etmetal.testing import cortex_m_flow, cortex_m_host  # noqa: E402

SUITE_ATOL, SUITE_RTOL = 1e-1, 4e-2  # backends/test/suite/runner.py


class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def _lowered(flow, model, inputs):
    from executorch.backends.test.harness.stages import StageType

    tester = flow.tester_factory(model, inputs)
    tester.quantize(flow.quantize_stage_factory())
    tester.export(tester._get_default_stage(StageType.EXPORT))
    tester.to_edge_transform_and_lower()
    tester.to_executorch()
    tester.serialize()
    return tester


def _operators(tester) -> set[str]:
    from executorch.backends.test.harness.stages import StageType
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(tester.get_artifact(StageType.SERIALIZE))
    program = getattr(pte, "program", pte)
    return {op.name for plan in program.execution_plan for op in plan.operators}


def test_flow_lowers_to_cortex_m_operators_and_passes():
    flow = cortex_m_flow.make_flow()
    assert flow.name == "cortex_m_host" and flow.quantize and not flow.is_delegated
    inputs = (torch.randn(1, 8, 4, 4), torch.randn(1, 8, 4, 4))
    tester = _lowered(flow, Add(), inputs)
    assert "cortex_m::quantized_add" in _operators(tester)
    tester.run_method_and_compare_outputs(inputs=inputs, atol=SUITE_ATOL, rtol=SUITE_RTOL)


def test_a_mismatch_of_the_program_itself_is_attributed_to_the_program():
    # a wide output range makes one int8 step (several units) exceed the suite's atol;
    # the integer kernel rounds near-ties differently from the float reference
    flow = cortex_m_flow.make_flow()
    model = torch.nn.Linear(64, 64)
    inputs = (torch.randn(64, 64) * 100,)
    tester = _lowered(flow, model, inputs)
    assert "cortex_m::quantized_linear" in _operators(tester)
    with pytest.raises(AssertionError) as info:
        tester.run_method_and_compare_outputs(inputs=inputs, atol=SUITE_ATOL, rtol=SUITE_RTOL)
    assert str(info.value).startswith(cortex_m_flow.PROGRAM_CAUSE), str(info.value)[:500]


def test_a_mismatch_of_the_runtime_is_attributed_to_the_runtime(monkeypatch):
    original = cortex_m_host.run_program

    def off_by_one_step(buffer, inputs):
        # a runtime bug: every output moved by one unit (several int8 steps of this case)
        return [o + 1.0 for o in original(buffer, inputs)]

    monkeypatch.setattr(cortex_m_host, "run_program", off_by_one_step)
    flow = cortex_m_flow.make_flow()
    inputs = (torch.randn(1, 8, 4, 4), torch.randn(1, 8, 4, 4))
    tester = _lowered(flow, Add(), inputs)
    with pytest.raises(AssertionError) as info:
        tester.run_method_and_compare_outputs(inputs=inputs, atol=SUITE_ATOL, rtol=SUITE_RTOL)
    message = str(info.value)
    assert message.startswith(cortex_m_flow.RUNTIME_CAUSE), message[:500]
    assert "max difference 1.0" in message


def test_suite_plugin_registers_the_flow():
    import executorch.backends.test.suite.flow as flow_module

    from etmetal.testing import backend_suite

    flows = flow_module.all_flows()
    assert flows["cortex_m_host"] is backend_suite.CORTEX_M_HOST_TEST_FLOW
    assert {"portable", "etmetal", "metal_host"} <= set(flows)
