"""The ``cortex_m_host`` flow of ExecuTorch's backend test suite: upstream's ``cortex_m`` flow,
run in etmetal's runtime instead of on the Corstone FVP.

The stages are upstream's: ``CortexMQuantize`` (PT2E), export, ``to_edge`` with the
Cortex-M edge config, ``CortexMPassManager`` (quantized patterns become ``cortex_m::``
operators), ``to_executorch``, serialize. The serialized ``.pte`` then runs in
``etmetal.runtime``, and the suite compares it with the quantized exported program
(its ``atol`` 1e-1, ``rtol`` 4e-2, no ``qtol``).

When the comparison fails, the flow asks where the difference comes from: it runs the
same Cortex-M program (the graph after the passes) on ExecuTorch's own Python reference
kernels (``torch.ops.cortex_m.*``) with the same inputs. If etmetal's output equals that
one, the program itself is that far from the reference (quantization or the passes),
not the runtime; the assertion message starts with which it is, so failure reports can
be grouped by cause.
"""

from __future__ import annotations

import torch

FLOW_NAME = "cortex_m_host"
# first words of a mismatch message: the cause, for grouping failures
PROGRAM_CAUSE = "cortex_m_host mismatch caused by the lowered program (quantization/passes)"
RUNTIME_CAUSE = "cortex_m_host mismatch caused by the runtime"


def _as_tensors(outputs) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [o for o in outputs if isinstance(o, torch.Tensor)]


def _max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    """Largest absolute difference, or None when the outputs do not line up."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    diffs = [(x.double() - y.double()).abs().max().item() for x, y in zip(a, b) if x.numel()]
    return max(diffs, default=0.0)


def make_flow():
    """Build the ``cortex_m_host`` ``TestFlow`` (imports the Cortex-M and Arm test stacks)."""
    from executorch.backends.cortex_m.test import tester as cortex_m_tester
    from executorch.backends.test.harness.stages import Serialize, StageType
    from executorch.backends.test.suite.flow import TestFlow
    from executorch.backends.test.suite.flows import cortex_m as upstream

    from etmetal.testing.cortex_m_host import run_program

    class HostLower(cortex_m_tester.CortexMToEdgeTransformAndLower):
        """Upstream's lowering stage; keeps the Cortex-M program as an eager module
        (``module()`` copies the graph) before ``to_executorch`` rewrites it."""

        def run(self, artifact, inputs=None, generate_etrecord: bool = False) -> None:
            super().run(artifact, inputs, generate_etrecord=generate_etrecord)
            self.dialect_module = self.edge_dialect_program.exported_program().module()

    class HostSerialize(Serialize):
        """Serialization as upstream's; the run step is etmetal's, and it remembers what it
        ran for the cause analysis."""

        last_inputs = None
        last_outputs = None

        def run_artifact(self, inputs):
            self.last_inputs = inputs
            self.last_outputs = run_program(self.buffer, inputs)
            return self.last_outputs

    class HostTester(upstream._ChannelsLastTester):
        def __init__(self, module, example_inputs, target_config=None, **kwargs):
            super().__init__(module, example_inputs, target_config=target_config, **kwargs)
            # upstream's default target when none is given (Cortex-M55)
            target_config = target_config or cortex_m_tester.CortexMTargetConfig(
                cpu=cortex_m_tester.CortexM.M55
            )
            self.stage_classes[StageType.TO_EDGE_TRANSFORM_AND_LOWER] = lambda: HostLower(
                target_config=target_config
            )
            self.stage_classes[StageType.SERIALIZE] = HostSerialize

        def run_method_and_compare_outputs(self, *args, **kwargs):
            try:
                return super().run_method_and_compare_outputs(*args, **kwargs)
            except AssertionError as exc:
                raise AssertionError(f"{self._mismatch_cause()}\n{exc}") from exc

        def _mismatch_cause(self) -> str:
            lower = self.stages.get(StageType.TO_EDGE_TRANSFORM_AND_LOWER)
            serialize = self.stages.get(StageType.SERIALIZE)
            module = getattr(lower, "dialect_module", None)
            if module is None or serialize is None or serialize.last_inputs is None:
                return "cortex_m_host mismatch (cause not analysed: no lowered program kept)"
            with torch.no_grad():
                dialect = _as_tensors(module(*serialize.last_inputs))
            host = _as_tensors(serialize.last_outputs)
            difference = _max_difference(host, dialect)
            if difference == 0.0:
                return (
                    f"{PROGRAM_CAUSE}: etmetal's output equals the Cortex-M program on "
                    "ExecuTorch's Python reference kernels"
                )
            return (
                f"{RUNTIME_CAUSE}: etmetal's output differs from the Cortex-M program on "
                f"ExecuTorch's Python reference kernels (max difference {difference})"
            )

    def create_tester(model, inputs, **kwargs):
        return HostTester(model, upstream._to_channels_last(inputs), timeout=900, **kwargs)

    return TestFlow(
        FLOW_NAME,
        backend="cortex_m",
        tester_factory=create_tester,
        quantize=True,
        quantize_stage_factory=cortex_m_tester.CortexMQuantize,
        is_delegated=False,
        # a lowering limitation (fixed shapes), not a run-time one: kept as upstream's
        param_skip_reasons=dict(upstream.CORTEX_M_TEST_FLOW.param_skip_reasons),
    )
