"""etmetal: a Metal (AOTInductor) backend for ExecuTorch and a Python runtime for .pte programs.

The top-level names are resolved lazily so that importing the runtime
(``etmetal.runtime``) never pulls in the ahead-of-time stack and the other way round.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

try:  # the one version, pyproject's, as installed
    __version__ = importlib.metadata.version("etmetal")
except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
    __version__ = "0+unknown"

# public name -> module that defines it
_LAZY = {
    "backend_config": "etmetal.layout.config",
    "MetalPartitioner": "etmetal.backend.metal_partitioner",
    "MetalBackend": "etmetal.backend.metal_backend",
    "lower": "etmetal.backend.lowering",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'etmetal' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
