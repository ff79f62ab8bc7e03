"""``python -m etmetal.shims.emulated_mps.stock_msl_compile SOURCE_FILE``: what the stock
runtime's native side runs on a shader-cache miss (``stock_runtime/stock_mps.cpp``). It
compiles the library with etmetal's MSL compiler and publishes its record
(:mod:`stock_msl`); a module of its own, so the record format does not import the compiler
that imports it."""

from __future__ import annotations

import sys
from pathlib import Path

from .msl import MslError, compile_library
from .stock_msl import publish


def main(argv: list[str]) -> int:
    """``stock_msl_compile SOURCE_FILE``: compile the library and publish its record; exit 1 with
    the compiler's message on stderr when it does not compile."""
    if len(argv) != 1:
        print(
            "usage: python -m etmetal.shims.emulated_mps.stock_msl_compile SOURCE_FILE",
            file=sys.stderr,
        )
        return 2
    source = Path(argv[0]).read_bytes().decode("utf-8", errors="replace")
    try:
        publish(source, compile_library(source))
    except MslError as exc:
        print(f"the shader library failed to compile: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
