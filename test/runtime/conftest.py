"""Fixtures for the runtime tests: lowering models to ``.pte`` and the stock runtime as reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# pytest runs with --import-mode=importlib: make this folder's helper modules importable
sys.path.insert(0, str(Path(__file__).parent))


def to_pte(
    programs,
    example_inputs=None,
    *,
    dynamic_shapes=None,
    config=None,
    compile_config=None,
    partitioner=None,
):
    """Export ``programs`` (a module, or {method: (module, inputs)}) and return the .pte bytes."""
    from executorch.exir import (
        EdgeCompileConfig,
        ExecutorchBackendConfig,
        to_edge_transform_and_lower,
    )

    if isinstance(programs, dict):
        eps = {
            name: torch.export.export(m.eval(), inputs, strict=False)
            for name, (m, inputs) in programs.items()
        }
    else:
        eps = torch.export.export(
            programs.eval(), example_inputs, dynamic_shapes=dynamic_shapes, strict=False
        )
    edge = to_edge_transform_and_lower(
        eps,
        partitioner=partitioner,
        compile_config=compile_config or EdgeCompileConfig(_check_ir_validity=False),
    )
    return edge.to_executorch(config or ExecutorchBackendConfig()).buffer


def stock_run(pte: bytes, inputs, method: str = "forward"):
    """Run with ExecuTorch's own runtime (the C++ one through pybindings)."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)
    return list(program.load_method(method).execute(list(inputs)))


def etmetal_run(pte: bytes, inputs, method: str = "forward", **kwargs):
    from etmetal.runtime import Runtime

    program = Runtime.get().load_program(pte, **kwargs)
    return program.load_method(method).execute(list(inputs))


@pytest.fixture(scope="session")
def lower():
    return to_pte


@pytest.fixture(scope="session")
def stock():
    return stock_run


@pytest.fixture(scope="session")
def etmetal():
    return etmetal_run
