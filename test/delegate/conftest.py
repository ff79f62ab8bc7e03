"""Shared lowered programs for the delegate tests (AOTI artifacts come from the compile cache)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from etmetal.backend.lowering import lower
from etmetal.runtime import Runtime

# pytest runs with --import-mode=importlib: make this folder's helper modules importable
sys.path.insert(0, str(Path(__file__).parent))


class Lowered:
    """One module lowered with ``MetalPartitioner(target="host")`` (or the ``target`` the
    lower kwargs name): the ``.pte`` and its ops."""

    def __init__(self, module: torch.nn.Module, inputs: tuple, **kwargs) -> None:
        self.module = module.eval()
        self.inputs = inputs
        program, self.partitioner = lower(module, inputs, **{"target": "host", **kwargs})
        self.pte: bytes = program.buffer

    def execute(self, inputs) -> list[torch.Tensor]:
        """One execute of the ``.pte``'s forward in etmetal's runtime (method destroyed after)."""
        program = Runtime.get().load_program(self.pte, trust_native_code=True)
        method = program.load_method("forward")
        try:
            return method.execute(list(inputs))
        finally:
            method.destroy()


@pytest.fixture(scope="session")
def lowered_cache() -> dict[str, Lowered]:
    return {}


@pytest.fixture(scope="session")
def lowered(lowered_cache):
    """``lowered(key, make)``: ``make()`` returns (module, inputs[, lower kwargs]); cached."""

    def get(key: str, make) -> Lowered:
        if key not in lowered_cache:
            made = make()
            kwargs = made[2] if len(made) > 2 else {}
            lowered_cache[key] = Lowered(made[0], made[1], **kwargs)
        return lowered_cache[key]

    return get
