"""Every C/C++ source and header of the project compiles on its own with all warnings as errors.

Each file is handed to the system compiler alone (``-fsyntax-only``): a fragment that only
compiles spliced into something else, or a warning, fails here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import etmetal
from etmetal.common.native_build import WARNINGS, compiler

PACKAGE = Path(etmetal.__file__).resolve().parent
# the kernels' and the bridge's native code; src/etmetal/shims/metal (the emulated Metal device's C++20,
# built by msl_compiler.py with its own flags) is not covered here yet
FOLDERS = ("runtime/kernels/native", "shims")
SOURCES = sorted(
    p
    for folder in FOLDERS
    for p in (PACKAGE / folder).resolve().iterdir()
    if p.suffix in (".c", ".cpp", ".h", ".hpp")
)


def test_the_sources_are_found():
    names = {p.name for p in SOURCES}
    assert {"strided_copy.c", "transpose_kernels.c", "transpose_kernels.h"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_source_compiles_alone_without_warnings(path: Path):
    cpp = path.suffix in (".cpp", ".hpp")
    cc = compiler("c++" if cpp else "c")
    std = "-std=c++17" if cpp else "-std=c11"
    lang = ("c++-header" if cpp else "c-header") if path.suffix in (".h", ".hpp") else None
    cmd = [cc, std, *WARNINGS, "-fsyntax-only", *(["-x", lang] if lang else []), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{path} does not compile alone:\n{proc.stderr}"
