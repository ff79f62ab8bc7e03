"""Every C/C++ source and header of the package compiles on its own with all warnings as errors.

Each file is handed to the system compiler alone (``-fsyntax-only``, ``-Wall -Wextra -Werror``)
with the language standard its build really uses: a fragment that only compiles spliced into
something else, or a warning, fails here. Three kinds of file are checked in the one context
they are built in, and each is named below:

- ``shims/emulated_mps/bridge_source.cpp``, ``mps_encoder.cpp``, ``mps_buffers.cpp`` and
  ``mps_fallbacks.cpp`` are compiled into the generated shim bridge, after the bridge's
  globals, one after the other: they are checked inside that prelude
  (``etmetal.shims.bridge``);
- ``msl_dispatch.cpp``, ``msl_check.cpp`` and ``msl_pool.cpp`` are one unit, the dispatcher
  (the checker and the pool use the executor's records): it is checked as it is built;
- ``msl_types.h``, ``msl_math.h`` and ``msl_sync.h`` are the parts of ``msl_compat.h`` (the
  Metal-compatibility header a shader library is compiled after) and are checked through it.

``shims/fast_run.c`` is a CPython extension: it gets this interpreter's include folder, as
its build does. Sources of ``stock_runtime/`` include ExecuTorch's runtime headers: they get the wheel's
include folders and definitions, as their build does (``executorch_compile_flags``), the
``shims/`` folder (the native layer the MetalBackend links) and the two includes its build
generates (``itemsizes.inc``, ``wrapper_template.inc``, written by ``stock_runtime.build``).
The proxy library's units (``shims/proxy_native.cpp``, ``proxy_parse.cpp``, ``proxy_nodes.h``)
include torch's C++ headers and the rules table their build generates (``proxy_rules.h``):
they get both, as their build does (``proxy_native``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import etmetal
from etmetal.common.native_build import WARNINGS, compiler

PACKAGE = Path(etmetal.__file__).resolve().parent
SOURCES = sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".c", ".cpp", ".h", ".hpp"))
MSL = "shims/emulated_mps"
# the emulated Metal device is C++ throughout; MSL on the CPU needs C++20
CXX_HEADERS = {
    f"{MSL}/msl_abi.h": "-std=c++17",
    f"{MSL}/msl_compat.h": "-std=c++20",
    f"{MSL}/msl_check.h": "-std=c++20",  # msl_compat.h's part for a checked build
    "shims/json_reader.h": "-std=c++17",  # the native proxy executor's JSON reader
}
HEADER_PARTS = {
    f"{MSL}/{n}": f"{MSL}/msl_compat.h"
    for n in ("msl_types.h", "msl_math.h", "msl_sync.h", "msl_split.h")
}
BRIDGE_FRAGMENTS = {
    f"{MSL}/{n}"
    for n in ("bridge_source.cpp", "mps_encoder.cpp", "mps_buffers.cpp", "mps_fallbacks.cpp")
}
DISPATCHER_PARTS = {f"{MSL}/{n}" for n in ("msl_dispatch.cpp", "msl_check.cpp", "msl_pool.cpp")}
FRAGMENTS = BRIDGE_FRAGMENTS | DISPATCHER_PARTS


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


ALONE = [p for p in SOURCES if _rel(p) not in HEADER_PARTS and _rel(p) not in FRAGMENTS]


def _compile(text: str, lang: str, std: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [compiler("c++" if lang == "c++" else "c"), std, *WARNINGS, "-fsyntax-only"]
    return subprocess.run(
        [*cmd, *extra, "-x", lang, "-"], input=text, capture_output=True, text=True
    )


def test_the_sources_are_found():
    names = {p.name for p in SOURCES}
    # one of each kind, wherever its folder puts it: the kernels', the bridge's, the int4
    # shim's, the emulated Metal device's and the Metal launch benchmark's
    expected = {
        "strided_copy.c",
        "transpose_kernels.h",
        "native_tensors.cpp",
        "int4_linear.c",
        "msl_dispatch.cpp",
        "msl_compat.h",
        "metal_launch_driver.cpp",
    }
    assert expected <= names
    # every special case names a file that exists
    assert {*CXX_HEADERS, *HEADER_PARTS, *FRAGMENTS} <= {_rel(p) for p in SOURCES}


def test_the_standard_of_the_msl_header_is_the_one_its_build_uses():
    from etmetal.shims.emulated_mps import msl_compiler

    assert CXX_HEADERS[f"{MSL}/msl_compat.h"] == msl_compiler._STD


@pytest.fixture(scope="module")
def stock_generated(tmp_path_factory) -> Path:
    """The includes the builds generate (the fallbacks' and ``stock_runtime.build``'s), as
    the builds write them."""
    from etmetal.shims import fallback_codegen, proxy_rules
    from etmetal.stock_runtime import build

    directory = tmp_path_factory.mktemp("stock-generated")
    # the generated fallbacks (shims/native_fallbacks.* include them), then the stock build's
    for name, content in fallback_codegen.files().items():
        (directory / name).write_bytes(content)
    (directory / "itemsizes.inc").write_bytes(build._itemsize_include())
    (directory / proxy_rules.HEADER_NAME).write_text(proxy_rules.generate())
    template = build._template_include(build.wrapper_template())
    (directory / "wrapper_template.inc").write_bytes(template)
    return directory


def _context(rel: str, request) -> tuple[str, ...]:
    if rel == "shims/fast_run.c":  # a CPython extension: this interpreter's headers
        from etmetal.shims.fast_run import python_include

        return ("-I", python_include())
    # the proxy library's units, the only ones built against torch's C++ headers
    if rel in {"shims/proxy_native.cpp", "shims/proxy_parse.cpp", "shims/proxy_nodes.h"}:
        from etmetal.shims.proxy_native import torch_compile_flags

        return (*torch_compile_flags(), "-I", str(request.getfixturevalue("stock_generated")))
    if rel.startswith("shims/native_fallbacks.") or rel == "shims/proxy_host.cpp":
        return ("-I", str(request.getfixturevalue("stock_generated")))
    if rel.startswith("stock_runtime/"):
        from etmetal.stock_runtime.runner import executorch_compile_flags

        generated = request.getfixturevalue("stock_generated")
        return (
            *executorch_compile_flags(),
            "-I",
            str(PACKAGE / "shims"),
            "-I",
            str(generated),
        )
    return ()


@pytest.mark.parametrize("path", ALONE, ids=_rel)
def test_source_compiles_alone_without_warnings(path: Path, request):
    rel = _rel(path)
    context = _context(rel, request)
    if path.suffix in (".h", ".hpp"):
        # a header compiles alone when a unit that includes only it compiles
        cpp = rel in CXX_HEADERS or path.suffix == ".hpp" or bool(context)
        std = CXX_HEADERS.get(rel, "-std=c++17" if cpp else "-std=c11")
        proc = _compile(f'#include "{path}"\n', "c++" if cpp else "c", std, *context)
    else:
        cpp = path.suffix == ".cpp"
        std = "-std=c++17" if cpp else "-std=c11"
        proc = _compile(
            path.read_text(), "c++" if cpp else "c", std, "-I", str(path.parent), *context
        )
    assert proc.returncode == 0, f"{rel} does not compile alone:\n{proc.stderr}"


@pytest.mark.parametrize("part", sorted(HEADER_PARTS))
def test_header_parts_are_included_by_the_header_checked_for_them(part: str):
    entry = (PACKAGE / HEADER_PARTS[part]).read_text()
    included = re.findall(r'^#include "([^"]+)"', entry, re.MULTILINE)
    assert Path(part).name in included, f"{HEADER_PARTS[part]} no longer includes {part}"


def test_the_bridge_fragment_compiles_in_the_bridge_prelude(stock_generated):
    from etmetal.shims import bridge
    from etmetal.shims.emulated_mps import plugin

    # the emulated device's bridge source, as the bridge assembles it (no forwarders)
    source = bridge.generate_source({}, [plugin.DEVICE.bridge_source])
    for rel in sorted(BRIDGE_FRAGMENTS):
        assert (PACKAGE / rel).read_text() in source, f"{rel} is no longer in the bridge source"
    proc = _compile(
        source, "c++", "-std=c++17", "-I", str(PACKAGE / "shims"), "-I", str(stock_generated)
    )
    assert proc.returncode == 0, f"the device's fragments in the bridge prelude:\n{proc.stderr}"


def test_the_dispatcher_compiles_as_one_unit_without_warnings():
    from etmetal.shims.emulated_mps import msl_compiler

    # its parts in the build's order (the build pastes msl_abi.h where this includes it)
    source = "".join((PACKAGE / MSL / p).read_text() for p in msl_compiler.DISPATCHER_PARTS)
    abi = (PACKAGE / MSL / "msl_abi.h").read_text()
    assert source.replace('#include "msl_abi.h"', abi) == msl_compiler.dispatcher_source()
    proc = _compile(source, "c++", "-std=c++17", "-I", str(PACKAGE / MSL))
    assert proc.returncode == 0, f"the dispatcher unit:\n{proc.stderr}"
