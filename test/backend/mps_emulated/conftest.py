"""Programs lowered for the emulated Metal target (``mps_emulated``), shared by the session.

An ``mps_emulated`` compile (Inductor's Metal codegen + a g++ build of the wrapper) takes
about a minute cold; the AOTI cache keeps it across sessions and ``lowered_mps`` across
the tests of one session. ``emulated_so`` gives the cached ``.so`` + weights of an
exported program for tests that drive ``AotiModel`` directly (materialize modes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from etmetal.backend.lowering import lower
from etmetal.runtime import Runtime

sys.path.insert(0, str(Path(__file__).parent))

TARGET = "mps_emulated"


class LoweredMps:
    """One module lowered with ``MetalPartitioner(target="mps_emulated")``."""

    def __init__(self, module: torch.nn.Module, inputs: tuple) -> None:
        self.module = module.eval()
        self.inputs = inputs
        program, self.partitioner = lower(self.module, inputs, target=TARGET)
        self.pte: bytes = program.buffer

    def expected(self, inputs=None) -> list[torch.Tensor]:
        with torch.no_grad():
            out = self.module(*(self.inputs if inputs is None else inputs))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def run(self, inputs=None) -> list[torch.Tensor]:
        program = Runtime.get().load_program(self.pte, trust_native_code=True)
        method = program.load_method("forward")
        try:
            return method.execute(list(self.inputs if inputs is None else inputs))
        finally:
            method.destroy()


@pytest.fixture(scope="session")
def lowered_mps():
    """``lowered_mps(key, make)``: ``make()`` returns (module, inputs); lowered once."""
    cache: dict[str, LoweredMps] = {}

    def get(key: str, make) -> LoweredMps:
        if key not in cache:
            module, inputs = make()
            cache[key] = LoweredMps(module, inputs)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def emulated_so():
    """``emulated_so(module, inputs)`` -> (so_path, weights bytes) of the mps_emulated build."""
    from etmetal.backend.aoti_compile import compile_exported_program

    def get(module: torch.nn.Module, inputs: tuple):
        with torch.no_grad():
            ep = torch.export.export(module.eval(), inputs)
        art = compile_exported_program(ep, target=TARGET)
        return art.so_path, art.weights_bytes()

    return get
