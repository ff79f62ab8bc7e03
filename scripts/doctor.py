"""``etmetal doctor``: what this host has and which targets it can compile and run."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _compiler() -> tuple[str | None, str]:
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
            return path, (out.stdout.splitlines() or ["?"])[0]
    return None, "no C++ compiler on PATH (AOTInductor needs one)"


def _mps_available() -> bool:
    try:
        import torch

        return bool(torch.backends.mps.is_available())
    except Exception:
        return False


def mps_emulated_compile() -> tuple[bool, str]:
    """Whether this host can build the emulated Metal target: Inductor's mps codegen, the
    Metal headers the wrapper includes, and a C++ compiler for the wrapper."""
    try:
        import torch
        import torch._inductor.codegen.mps  # noqa: F401  (the Metal code generator)

        from etmetal.backends.mps_emulated_compile import compiler
    except Exception as exc:  # an old torch or a broken install
        return False, f"Inductor's mps code generation is not importable ({exc})"
    include = Path(torch.__file__).parent / "include"
    for header in ("ATen/native/mps/MetalShaderLibrary.h", "c10/metal/utils.h"):
        if not (include / header).exists():
            return False, f"torch's headers lack {header}"
    cxx = compiler()
    if cxx is None:
        return False, "no C++ compiler (g++ or $CXX) to build the Metal wrapper"
    return True, f"Inductor mps codegen, wrapper built with {cxx}"


def mps_emulated_run() -> tuple[bool, str]:
    """Whether etmetal's runtime can execute ``mps_emulated`` programs: its Metal delegate
    must accept the target and the emulated Metal device must be installed."""
    try:
        from etmetal.runtime import metal_delegate
    except Exception as exc:
        return False, f"etmetal's runtime is not importable ({exc})"
    if "mps_emulated" not in getattr(metal_delegate, "TARGET_DEVICES", {}):
        return False, "this etmetal's runtime has no emulated Metal device"
    try:
        importlib.import_module("etmetal.shims.metal.mps_device")
    except Exception as exc:
        return False, f"the emulated Metal device does not load ({exc})"
    return True, "emulated Metal device (etmetal.shims.metal)"


def _yes_no(ok: bool, why: str) -> str:
    return f"{'yes' if ok else 'no'} ({why})"


def collect() -> dict[str, str]:
    compiler, compiler_version = _compiler()
    mps = _mps_available()
    host_ok = compiler is not None
    return {
        "python": sys.version.split()[0],
        "platform": f"{platform.system()} {platform.machine()}",
        "etmetal": _version("etmetal"),
        "torch": _version("torch"),
        "executorch": _version("executorch"),
        "c++ compiler": f"{compiler} ({compiler_version})" if compiler else compiler_version,
        "target host": "compile + run" if host_ok else "unavailable: no C++ compiler",
        "target mps": "compile + run"
        if mps and host_ok
        else "unavailable: needs macOS with MPS (torch.backends.mps.is_available() is False)",
        "target mps_emulated": "compile: "
        + _yes_no(*mps_emulated_compile())
        + "; run: "
        + _yes_no(*mps_emulated_run()),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    facts = collect()
    if args.json:
        import json

        print(json.dumps(facts, indent=2))
    else:
        width = max(map(len, facts))
        for key, value in facts.items():
            print(f"{key:<{width}}  {value}")
    return 0 if facts["target host"].startswith("compile") else 1
