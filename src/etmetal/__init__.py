"""etmetal: a Metal (AOTInductor) backend for ExecuTorch and a Python runtime for .pte programs.

The top-level names are resolved lazily so that importing the runtime
(``etmetal.runtime``) never pulls in the ahead-of-time stack and the other way round.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "backend_config": "etmetal.backends.config",
    "MetalPartitioner": "etmetal.partitioner.metal_partitioner",
    "MetalBackend": "etmetal.backends.metal_backend",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'etmetal' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
