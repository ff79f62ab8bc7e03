"""Programs lowered for ``mps_emulated``, shared by the tests of a session.

A cold ``mps_emulated`` compile (Inductor's Metal codegen, then g++ of the wrapper) takes
tens of seconds; the AOTI cache keeps it across sessions, these fixtures across tests.
"""

from __future__ import annotations

import pytest
import torch

from etmetal.backend.lowering import lower
from etmetal.examples.metal_registry import get_model_and_inputs


class EmulatedProgram:
    def __init__(self, name: str) -> None:
        self.module, self.inputs = get_model_and_inputs(name)
        program, self.partitioner = lower(self.module, self.inputs, target="mps_emulated")
        self.pte: bytes = program.buffer


@pytest.fixture(scope="session")
def mps_emulated_program():
    """``mps_emulated_program(name)``: a registry module lowered for mps_emulated, once."""
    cache: dict[str, EmulatedProgram] = {}

    def get(name: str) -> EmulatedProgram:
        if name not in cache:
            cache[name] = EmulatedProgram(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def mps_emulated_artifact():
    """``mps_emulated_artifact(name)``: the AotiArtifact (``.so``, weights, wrapper ``.cpp``)
    of a registry module exported and compiled directly for mps_emulated."""
    from etmetal.backend.aoti_compile import compile_exported_program

    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            module, inputs = get_model_and_inputs(name)
            with torch.no_grad():
                ep = torch.export.export(module, inputs)
            cache[name] = (module, compile_exported_program(ep, target="mps_emulated"))
        return cache[name]

    return get
