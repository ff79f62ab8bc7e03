"""Shared artifacts for the hardening tests: demo models lowered to the Metal delegate
(AOTI compile cache) and the crashing test ``.so``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# pytest runs with --import-mode=importlib: make this folder's helper modules importable
sys.path.insert(0, str(Path(__file__).parent))


class Demo:
    def __init__(self, name: str):
        from etmetal.backend.lowering import lower  # noqa: I001 - models.demo: delegate branch
        from etmetal.examples.demo import get_demo

        self.name = name
        self.module, inputs = get_demo(name)
        self.inputs = list(inputs)
        program, _ = lower(self.module, inputs, target="host")
        self.pte: bytes = program.buffer
        with torch.no_grad():
            self.expected = self.module(*inputs)


@pytest.fixture(autouse=True)
def _one_thread():
    # OpenMP kernels spin on a busy 2-core machine; one thread keeps executes cheap
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def demos() -> dict[str, Demo]:
    return {name: Demo(name) for name in ("transformer_block", "patch_embedding")}


@pytest.fixture(scope="session")
def crash_artifacts(tmp_path_factory):
    from crash_delegate import build_crash_so, crash_pte

    so = build_crash_so(tmp_path_factory.mktemp("crash_so"))
    return so, crash_pte(so)
