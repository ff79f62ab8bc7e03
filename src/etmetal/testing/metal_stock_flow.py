"""The ``metal_stock`` flow of ExecuTorch's backend conformance suite: etmetal's delegate in
ExecuTorch's own runtime.

It lowers like ``metal_host`` (``MetalPartitioner`` for ``host``, ``etmetal.backend_config()``)
but for upstream's runtime (``runtime="upstream"``: no proxy executor, so operators without a
C shim stay with the portable kernels, and upstream's one weights blob per partition), and
it runs the ``.pte`` with the suite's own Serialize stage, the stock runtime the pybind
module wraps, after ``etmetal.stock_runtime.register`` has put etmetal's native
``MetalBackend`` into it (native code trusted: the suite compiled it on this machine). The
two flows differ in the runtime and in what ``runtime="upstream"`` keeps out.
"""

from __future__ import annotations

import os

from etmetal.common.targets import HOST

FLOW_NAME = "metal_stock"
UPSTREAM_RUNTIME = "upstream"


def make_flow(delegated_log_env: str):
    """The flow; each program it runs is recorded in the file ``$delegated_log_env`` names
    (the suite serializes only delegated programs)."""
    from executorch.backends.test.harness import Tester
    from executorch.backends.test.harness.stages import (
        Serialize,
        StageType,
        ToEdgeTransformAndLower,
        ToExecutorch,
    )
    from executorch.backends.test.suite.flow import TestFlow
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    class MetalStockLower(ToEdgeTransformAndLower):
        def __init__(self, partitioners=None, edge_compile_config=None):
            from etmetal.backend.metal_partitioner import MetalPartitioner

            super().__init__(
                default_partitioner_cls=lambda: MetalPartitioner(
                    target=HOST.name, runtime=UPSTREAM_RUNTIME
                ),
                partitioners=partitioners,
                edge_compile_config=edge_compile_config,
            )

    class MetalStockToExecutorch(ToExecutorch):
        def __init__(self, config=None):
            from etmetal.layout.config import backend_config

            super().__init__(
                config
                or backend_config(
                    extract_delegate_segments=True,
                    sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(),
                )
            )

    class MetalStockSerialize(Serialize):
        """The stock Serialize stage unchanged, with etmetal's backend registered."""

        def run_artifact(self, inputs):
            import etmetal.stock_runtime

            log = os.environ.get(delegated_log_env)
            if log:
                with open(log, "a") as f:
                    f.write(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0] + "\n")
            etmetal.stock_runtime.register(trust_native_code=True)
            return super().run_artifact(inputs)

    class MetalStockTester(Tester):
        def __init__(self, module, example_inputs, dynamic_shapes=None):
            stages = Tester.default_stage_classes()
            stages[StageType.TO_EDGE_TRANSFORM_AND_LOWER] = MetalStockLower
            stages[StageType.TO_EXECUTORCH] = MetalStockToExecutorch
            stages[StageType.SERIALIZE] = MetalStockSerialize
            super().__init__(module, example_inputs, stages, dynamic_shapes=dynamic_shapes)

    return TestFlow(FLOW_NAME, backend="metal", tester_factory=MetalStockTester, is_delegated=True)
