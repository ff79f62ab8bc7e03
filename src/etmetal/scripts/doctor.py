"""``etmetal doctor``: what this host has and which targets it can compile and run."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import shutil
import subprocess
import sys

from etmetal.common.targets import MPS_EMULATED


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


def mps_emulated_run() -> tuple[bool, str]:
    """Whether etmetal's runtime can execute ``mps_emulated`` programs: its Metal delegate
    must accept the target and the emulated Metal device must be installed."""
    try:
        from etmetal.runtime import metal_delegate
    except Exception as exc:
        return False, f"etmetal's runtime is not importable ({exc})"
    if MPS_EMULATED.name not in getattr(metal_delegate, "TARGET_DEVICES", {}):
        return False, "this etmetal's runtime has no emulated Metal device"
    try:
        importlib.import_module("etmetal.shims.emulated_mps.mps_device")
    except Exception as exc:
        return False, f"the emulated Metal device does not load ({exc})"
    return True, "emulated Metal device (etmetal.shims.emulated_mps)"


def _yes_no(ok: bool, why: str) -> str:
    return f"{'yes' if ok else 'no'} ({why})"


def collect() -> dict[str, str]:
    from etmetal.backend.mps_emulated_compile import host_can_compile

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
        + _yes_no(*host_can_compile())
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
