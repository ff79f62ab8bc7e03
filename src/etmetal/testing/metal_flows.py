"""The delegated flows of ExecuTorch's backend conformance suite: ``metal_host``,
``metal_stock`` and ``metal_emulated``, one factory for all three.

Each lowers every case with ``MetalPartitioner`` and ``etmetal.backend_config()``, and they
differ only where a user's deployment differs:

- ``metal_host``: lowered for etmetal's runtime (the default ``runtime="etmetal"``: the proxy
  executor serves operators without a C shim, shared weights), run by ``etmetal.runtime``;
- ``metal_stock``: lowered for upstream's runtime (``runtime="upstream"``: no proxy executor,
  so operators without a C shim stay with the portable kernels, one weights blob per
  partition), run by the suite's own Serialize stage, i.e. the stock runtime the pybind
  module wraps, after ``etmetal.stock_runtime.register`` has put etmetal's native
  ``MetalBackend`` into it;
- ``metal_emulated``: the ``mps_emulated`` target for its default runtime (a Mac's: an
  operator whose fallback ExecuTorch's Metal runtime lacks stays out of the delegate, as
  on a Mac), run by ``etmetal.runtime``: Inductor's Metal code on the emulated Metal
  device, so its counts next to ``metal_host``'s show what the Metal lowering and the
  device do differently (issue 27).

Native code is trusted in both: the suite compiled it on this machine. Every program a flow
runs is recorded in the file ``$<delegated_log_env>`` names (the suite serializes only
delegated programs), so the report can tell delegated passes apart.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

from etmetal.common.targets import HOST, MPS_EMULATED

METAL_HOST = "metal_host"
METAL_STOCK = "metal_stock"
METAL_EMULATED = "metal_emulated"
UPSTREAM_RUNTIME = "upstream"


def _run_in_etmetal(stage, inputs):
    from torch.utils._pytree import tree_flatten

    from etmetal.runtime import Runtime

    flat, _ = tree_flatten(inputs)
    program = Runtime.get().load_program(stage.buffer, trust_native_code=True)
    method = program.load_method("forward")
    try:
        return copy.deepcopy(method.execute(list(flat)))
    finally:
        method.destroy()


def _run_in_stock_runtime(stage, inputs):
    from executorch.backends.test.harness.stages import Serialize

    import etmetal.stock_runtime

    etmetal.stock_runtime.register(trust_native_code=True)
    return Serialize.run_artifact(stage, inputs)  # the stock stage, unchanged


# flow name -> (target, the runtime its programs are lowered for, how its Serialize stage
# runs them)
_FLOWS: dict[str, tuple[str, str | None, Callable]] = {
    METAL_HOST: (HOST.name, None, _run_in_etmetal),
    METAL_STOCK: (HOST.name, UPSTREAM_RUNTIME, _run_in_stock_runtime),
    METAL_EMULATED: (MPS_EMULATED.name, None, _run_in_etmetal),
}
FLOW_NAMES = tuple(_FLOWS)


def make_flow(name: str, delegated_log_env: str):
    """The suite's ``TestFlow`` named ``name`` (one of ``FLOW_NAMES``)."""
    from executorch.backends.test.harness import Tester
    from executorch.backends.test.harness.stages import (
        Serialize,
        StageType,
        ToEdgeTransformAndLower,
        ToExecutorch,
    )
    from executorch.backends.test.suite.flow import TestFlow
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    target, runtime, run = _FLOWS[name]

    class MetalLower(ToEdgeTransformAndLower):
        def __init__(self, partitioners=None, edge_compile_config=None):
            from etmetal.backend.metal_partitioner import MetalPartitioner

            # the stock stage keeps ``partitioners`` only when a default class is given too
            super().__init__(
                default_partitioner_cls=lambda: MetalPartitioner(target=target, runtime=runtime),
                partitioners=partitioners,
                edge_compile_config=edge_compile_config,
            )

    class MetalToExecutorch(ToExecutorch):
        def __init__(self, config=None):
            from etmetal.layout.config import backend_config

            super().__init__(
                config
                or backend_config(
                    extract_delegate_segments=True,
                    sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(),
                )
            )

    class MetalSerialize(Serialize):
        def run_artifact(self, inputs):
            log = os.environ.get(delegated_log_env)
            if log:  # record which programs ran
                with open(log, "a") as f:
                    f.write(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0] + "\n")
            return run(self, inputs)

    class MetalTester(Tester):
        def __init__(self, module, example_inputs, dynamic_shapes=None):
            stages = Tester.default_stage_classes()
            stages[StageType.TO_EDGE_TRANSFORM_AND_LOWER] = MetalLower
            stages[StageType.TO_EXECUTORCH] = MetalToExecutorch
            stages[StageType.SERIALIZE] = MetalSerialize
            super().__init__(module, example_inputs, stages, dynamic_shapes=dynamic_shapes)

    return TestFlow(name, backend="metal", tester_factory=MetalTester, is_delegated=True)
