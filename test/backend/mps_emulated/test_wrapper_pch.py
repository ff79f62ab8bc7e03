"""The mps_emulated wrapper's precompiled header: g++ reads it, the .so it gives is the one
the plain build gives, and no stale, corrupted or broken header can change a build."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from etmetal.backend import mps_emulated_compile, wrapper_pch
from etmetal.common.cache import ContentCache

pytestmark = pytest.mark.skipif(
    mps_emulated_compile.compiler() is None, reason="needs a C++ compiler"
)

TINY_WRAPPER = (
    "#include <vector>\n\n#include <string>\nint f() { return std::vector<int>(3).size(); }\n"
)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("ETMETAL_CACHE_DIR", str(root))
    return root


def _flags(*extra: str) -> list[str]:
    return ["-std=c++20", "-O1", "-fPIC", "-w", *extra]


def test_the_prelude_is_the_wrappers_leading_includes():
    assert wrapper_pch.leading_includes(TINY_WRAPPER) == "#include <vector>\n#include <string>\n"
    assert wrapper_pch.leading_includes("int x;\n#include <vector>\n") == ""


def test_a_real_wrapper_builds_with_the_header_gcc_reads_it_and_the_so_is_unchanged(
    mps_emulated_artifact, tmp_path, monkeypatch
):
    _, artifact = mps_emulated_artifact("mm_weight_param")
    cpp = artifact.wrapper_cpp_path
    commands: list[list[str]] = []
    link = mps_emulated_compile._link_wrapper

    def spy(cxx, flags, pch, cpp_, objects, so):
        commands.append(mps_emulated_compile.wrapper_command(cxx, flags, pch, cpp_, objects, so))
        return link(cxx, flags, pch, cpp_, objects, so)

    monkeypatch.setattr(mps_emulated_compile, "_link_wrapper", spy)
    defines = ["USE_MPS", "USE_MMAP_EXTERNAL", "TORCH_INDUCTOR_CPP_WRAPPER"]
    with_pch, plain = tmp_path / "pch.so", tmp_path / "plain.so"
    mps_emulated_compile.compile_wrapper(cpp, [], defines, with_pch)
    (cmd,) = commands
    header = Path(cmd[cmd.index("-include") + 1])
    assert header.name == wrapper_pch.HEADER and (header.parent / "complete").exists()
    # -H lists what the compile reads; "!" marks a precompiled header it used
    probe = [*cmd[: cmd.index("-shared")], "-H", "-fsyntax-only", "-include", str(header), str(cpp)]
    proc = subprocess.run(probe, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"! {header}.gch" in proc.stderr.splitlines()

    monkeypatch.setenv(wrapper_pch.PCH_ENV, "0")
    mps_emulated_compile.compile_wrapper(cpp, [], defines, plain)
    assert "-include" not in commands[1]
    assert with_pch.read_bytes() == plain.read_bytes()


def test_the_key_follows_flags_prelude_compiler_and_header_contents(tmp_path, monkeypatch):
    cxx = mps_emulated_compile.compiler()
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "local.h").write_text("inline int g() { return 1; }\n")
    prelude = '#include "local.h"\n'
    base = wrapper_pch.entry_name(cxx, _flags(f"-I{inc}"), prelude)
    assert base == wrapper_pch.entry_name(cxx, _flags(f"-I{inc}"), prelude)
    # a .gch built at -O1 and read at -O2 can crash g++: flags are part of the key
    o2 = [f if f != "-O1" else "-O2" for f in _flags(f"-I{inc}")]
    assert wrapper_pch.entry_name(cxx, o2, prelude) != base
    assert wrapper_pch.entry_name(cxx, _flags(f"-I{inc}", "-DX=1"), prelude) != base
    assert wrapper_pch.entry_name(cxx, _flags(f"-I{inc}"), prelude + "#include <vector>\n") != base
    (inc / "local.h").write_text("inline int g() { return 2; }\n")
    wrapper_pch._preprocessed_digest.cache_clear()  # memoized per process
    assert wrapper_pch.entry_name(cxx, _flags(f"-I{inc}"), prelude) != base
    monkeypatch.setattr(wrapper_pch, "compiler_version", lambda cc: "another gcc")
    changed = wrapper_pch.entry_name(cxx, _flags(f"-I{inc}"), prelude)
    monkeypatch.undo()
    assert changed != wrapper_pch.entry_name(cxx, _flags(f"-I{inc}"), prelude)


def test_a_corrupted_header_is_rebuilt_not_used(private_cache, tmp_path):
    cxx = mps_emulated_compile.compiler()
    cpp = tmp_path / "tiny.wrapper.cpp"
    cpp.write_text(TINY_WRAPPER)
    header = wrapper_pch.prelude_header(cpp, cxx, _flags())
    assert header is not None and header.parent.parent == private_cache / wrapper_pch.KIND
    gch = Path(f"{header}.gch")
    good = gch.read_bytes()
    corrupted = b"\0" * 64 + good[64:]  # same size, other bytes
    gch.write_bytes(corrupted)
    os.utime(gch, ns=(1, 1))
    assert ContentCache(wrapper_pch.KIND).lookup(header.parent.name) is None
    again = wrapper_pch.prelude_header(cpp, cxx, _flags())
    assert again == header and gch.read_bytes() != corrupted
    assert ContentCache(wrapper_pch.KIND).lookup(header.parent.name) is not None
    probe = [cxx, *_flags(), "-H", "-fsyntax-only", "-include", str(header), str(cpp)]
    proc = subprocess.run(probe, capture_output=True, text=True)
    assert proc.returncode == 0 and f"! {gch}" in proc.stderr.splitlines(), proc.stderr


def test_a_header_that_breaks_the_build_falls_back_to_the_plain_build(
    private_cache, tmp_path, monkeypatch
):
    cpp = tmp_path / "tiny.wrapper.cpp"
    cpp.write_text(TINY_WRAPPER)
    broken = tmp_path / "broken.h"
    broken.write_text("#error this header is not the prelude\n")
    monkeypatch.setattr(wrapper_pch, "prelude_header", lambda *a: broken)
    so = tmp_path / "m.so"
    mps_emulated_compile.compile_wrapper(cpp, [], ["USE_MPS"], so)
    monkeypatch.undo()
    monkeypatch.setenv(wrapper_pch.PCH_ENV, "0")
    plain = tmp_path / "plain.so"
    mps_emulated_compile.compile_wrapper(cpp, [], ["USE_MPS"], plain)
    assert so.read_bytes() == plain.read_bytes()


def test_a_wrapper_error_is_still_reported_with_the_header_on(private_cache, tmp_path):
    cpp = tmp_path / "broken.wrapper.cpp"
    cpp.write_text("#include <vector>\nint f() { return undeclared_name; }\n")
    with pytest.raises(mps_emulated_compile.MpsEmulatedBuildError, match="undeclared_name"):
        mps_emulated_compile.compile_wrapper(cpp, [], ["USE_MPS"], tmp_path / "m.so")
