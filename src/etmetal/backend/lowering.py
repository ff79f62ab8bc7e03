"""``etmetal.lower``: export a module, partition it for the Metal backend and lower it to a
program in one call, the path the CLI, the tests and the benchmarks share."""

from __future__ import annotations

from typing import Any

import torch


def lower(
    module: torch.nn.Module,
    inputs: tuple[Any, ...],
    *,
    target: str = "auto",
    compile_specs: list | None = None,
    dynamic_shapes: Any = None,
    runtime: str | None = None,
):
    """Export, partition and lower ``module``; returns (ExecutorchProgramManager, partitioner).

    The program is serialized with :func:`etmetal.backend_config` (layout-safe ``view_copy``).
    ``runtime``: the runtime the program is for (see :class:`MetalPartitioner`).
    """
    from executorch.exir import to_edge_transform_and_lower

    from etmetal.backend.metal_partitioner import MetalPartitioner

    # imported here: the partitioner imports this package (backends) at module level
    from etmetal.layout.config import backend_config

    partitioner = MetalPartitioner(compile_specs, target=target, runtime=runtime)
    with torch.no_grad():
        ep = torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes)
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    return edge.to_executorch(backend_config()), partitioner
