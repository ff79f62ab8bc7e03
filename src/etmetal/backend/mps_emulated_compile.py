"""The ``mps_emulated`` target: Inductor's real Metal code, built for this CPU.

Inductor generates the same wrapper ``.cpp`` and Metal kernels a Mac gets
(:mod:`.mps_emulation` supplies the device it asks about); only the build differs: the
wrapper is compiled here with the system C++ compiler (``-std=c++20 -DUSE_MPS``, torch's
headers, no libtorch) into a host ``.so`` whose only undefined symbols are the AOTI
shim ABI (``aoti_torch_*``, including the Metal runtime ``aoti_torch_mps_*``) and the
C/C++ runtime libraries. etmetal's emulated Metal device serves those symbols.

What such a ``.so`` asks of the runtime (read from torch 2.13's
``aoti_runtime/model_base.h`` and the generated wrapper):

* Container: ``AOTInductorModelContainerCreateWithDevice(&h, 1, <mps>, NULL)``; the
  device string is parsed to ``aoti_torch_device_type_mps()`` (c10's MPS = 13), the
  device index is -1 unless given as ``"mps:N"``.
* Constants (built with ``USE_MMAP_EXTERNAL`` when the model has any):
  ``AOTInductorModelUpdateConstantsFromBlob(h, blob)`` makes ONE ``aoti_torch_mps_malloc
  (&base, total)`` (the sum of each constant's 64-byte-aligned size), then per constant
  ``aoti_torch_mps_memcpy(base, constant_offset, bytes_read, data_size, blob)`` (copies
  ``blob[bytes_read:+data_size]`` to ``base + constant_offset``), then
  ``aoti_torch_create_tensor_from_blob_v2(base, ndim, sizes, strides, offset, dtype,
  device_type_mps, device_index, ...)`` with the *base* pointer and the constant's place
  as an element ``offset`` (``constant_offset / element_size``). So, unlike ``host``,
  constants do not point into the blob: the blob may be released after the update. The
  allocation is released with ``aoti_torch_mps_free(base)`` when the model is destroyed.
* Kernels: each shader library is created once (``aoti_torch_mps_create_shader_library``
  + ``aoti_torch_mps_get_kernel_function(lib, "generated_kernel", &k)``), and each launch
  is ``aoti_torch_mps_run_command_block(k, aoti_torch_mps_shared_callback, &fn)`` where
  ``fn`` is a ``std::function<void(AOTIMetalKernelFunctionHandle)>`` that calls
  ``start_encoding``, ``set_arg_tensor``/``set_arg_int`` and a ``dispatch_*``.
* Intermediate buffers: ``aoti_torch_empty_strided`` with the mps device type.

The weights blob has the same format as ``host``'s (Inductor's ``binary_blob``: the
constants' bytes in the wrapper's constant order, each padded to 64 bytes).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from . import aoti_runtime_object, wrapper_pch
from .extern_nodes import find_extern_nodes
from .mps_decompositions import views_as_reshapes
from .mps_emulation import emulated_mps_codegen, fake_mps_module

log = logging.getLogger(__name__)

# part of the cache key: bump when the build below changes
BUILD_RECIPE = "g++ -std=c++20 -O1 -DUSE_MPS, no libtorch, views as reshapes, v2"

# libraries a .so may bind to besides the shims: versioned glibc/libstdc++/libgcc symbols
_SYSTEM_VERSIONS = ("GLIBC_", "GLIBCXX_", "CXXABI_", "GCC_")
# the Inductor build defines that matter for the wrapper (others select host ISA code)
_KEPT_DEFINES = (
    "TORCH_INDUCTOR_CPP_WRAPPER",
    "STANDALONE_TORCH_HEADER",
    "C10_USING_CUSTOM_GENERATED_MACROS",
    "USE_MMAP_EXTERNAL",
    "USE_MPS",
)


class MpsEmulatedBuildError(RuntimeError):
    """The emulated Metal build failed (compiler error or a symbol no shim serves)."""


@dataclass(frozen=True)
class MpsEmulatedBuild:
    so_path: Path
    weights_path: Path | None
    wrapper_cpp_path: Path
    extern_nodes_path: Path | None = None  # operators the proxy executor runs (if any)


def compiler() -> str | None:
    """The C++ compiler the build uses (``$CXX``, else ``g++``/``c++`` on PATH)."""
    env = os.environ.get("CXX")
    if env:
        return shutil.which(env)  # a $CXX that does not exist is not silently replaced
    return shutil.which("g++") or shutil.which("c++")


def generate(ep: ExportedProgram, options: dict[str, Any]) -> list[str]:
    """Inductor's ``mps`` code generation for ``ep`` (the C++ package only, no build)."""
    gm, inputs, reals = fake_mps_module(ep)
    views_as_reshapes(gm)  # views export fitted to CPU layouts; mps kernels may differ
    options = {**options, "aot_inductor.package": True, "aot_inductor.package_cpp_only": True}
    with torch.no_grad(), emulated_mps_codegen(reals):
        paths = torch._inductor.aot_compile(gm, inputs, options=options)
    return [str(p) for p in (paths if isinstance(paths, list) else [paths])]


def build_mps_emulated(
    ep: ExportedProgram, options: dict[str, Any], out_dir: Path
) -> MpsEmulatedBuild:
    """Generate ``ep``'s Metal wrapper and build it into ``out_dir/model.so``."""
    start = time.monotonic()
    paths = generate(ep, options)
    generated = time.monotonic()
    cpp = _one(paths, ".wrapper.cpp")
    if cpp is None:
        raise MpsEmulatedBuildError(
            f"Inductor's mps codegen produced no wrapper .cpp (got {paths})"
        )
    flags = _one(paths, "_compile_flags.json")
    objects = [p for p in paths if p.endswith(".o")]  # the weights-size header object
    blob = _one(paths, "_weights.blob")
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / "model.so"
    compile_wrapper(Path(cpp), [Path(o) for o in objects], _defines(flags), so)
    check_undefined_symbols(so)
    log.info(
        "mps_emulated: Metal codegen %.1f s, wrapper build %.1f s",
        generated - start,
        time.monotonic() - generated,
    )
    table = find_extern_nodes(paths)
    return MpsEmulatedBuild(
        so, Path(blob) if blob else None, Path(cpp), Path(table) if table else None
    )


def _one(paths: list[str], suffix: str) -> str | None:
    return next((p for p in paths if p.endswith(suffix)), None)


def _defines(flags_json: str | None) -> list[str]:
    """The defines Inductor chose for this wrapper (``USE_MMAP_EXTERNAL`` only when the
    model has constants), limited to those that are not about the host's ISA."""
    defines = {"USE_MPS"}
    if flags_json is not None:
        data = json.loads(Path(flags_json).read_text())
        defines |= {d.strip() for d in data.get("definitions", [])}
    return sorted(d for d in defines if d in _KEPT_DEFINES)


def torch_include_dirs() -> list[str]:
    root = Path(torch.__file__).parent / "include"
    return [str(root), str(root / "torch" / "csrc" / "api" / "include")]


def compile_wrapper(cpp: Path, objects: list[Path], defines: list[str], so: Path) -> None:
    """``g++ -shared`` of the wrapper (and the weights-size object) into ``so``."""
    cxx = compiler()
    if cxx is None:
        raise MpsEmulatedBuildError(
            "mps_emulated needs a C++ compiler (g++ or $CXX) to build the Metal wrapper for "
            "this host; none was found on PATH"
        )
    flags = [
        "-std=c++20",
        "-O1",
        "-fPIC",
        "-w",
        *(f"-D{d}" for d in defines),
        *(f"-I{d}" for d in torch_include_dirs()),
    ]
    pch = wrapper_pch.prelude_header(cpp, cxx, flags) if cpp.is_file() else None
    source, objects = _model_part(cxx, flags, cpp, objects, so)
    try:
        proc = _link_wrapper(cxx, flags, pch, source, objects, so)
        if proc.returncode != 0 and pch is not None:
            # never let the header be why a build fails: the plain build decides
            retry = _link_wrapper(cxx, flags, None, source, objects, so)
            if retry.returncode == 0:
                log.warning("mps_emulated: %s built only without the header %s", cpp, pch)
            proc = retry
    finally:
        if source != cpp:
            source.unlink(missing_ok=True)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "error" in line][:10]
        raise MpsEmulatedBuildError(
            f"building the mps_emulated wrapper {cpp} failed ({cxx} exit {proc.returncode}):\n"
            + "\n".join(errors or proc.stderr.splitlines()[-10:])
        )


def _model_part(
    cxx: str, flags: list[str], cpp: Path, objects: list[Path], so: Path
) -> tuple[Path, list[Path]]:
    """The source to compile and the objects to link: the wrapper's model part and the
    shared runtime object (:mod:`.aoti_runtime_object`), else the wrapper whole."""
    parts = aoti_runtime_object.split(cpp.read_text()) if aoti_runtime_object.enabled() else None
    if parts is None:
        return cpp, objects

    # built once, so without the precompiled header (the object is the same either way)
    def build(source: Path, out: Path) -> None:
        out_o = out / aoti_runtime_object.OBJECT
        aoti_runtime_object.compile_object([cxx, *flags, "-c", str(source), "-o", str(out_o)])

    try:
        runtime = aoti_runtime_object.runtime_object(cxx, flags, parts.runtime_source, build)
    except (OSError, RuntimeError) as exc:
        log.warning("mps_emulated: compiling %s whole (its runtime object: %s)", cpp, exc)
        return cpp, objects
    model = so.parent / f"{cpp.stem}.model.cpp"  # the wrapper may sit in a cache entry
    model.write_text(parts.model_source)
    return model, [runtime, *objects]


def wrapper_command(
    cxx: str, flags: list[str], pch: Path | None, cpp: Path, objects: list[Path], so: Path
) -> list[str]:
    """The wrapper's compile and link; ``pch``: the precompiled prelude to force-include
    (built with exactly ``flags``)."""
    include = ["-include", str(pch)] if pch is not None else []
    tail = [*map(str, objects), "-Wl,-z,noexecstack", "-o", str(so)]
    return [cxx, *flags, "-shared", *include, str(cpp), *tail]


def _link_wrapper(
    cxx: str, flags: list[str], pch: Path | None, cpp: Path, objects: list[Path], so: Path
) -> subprocess.CompletedProcess:
    cmd = wrapper_command(cxx, flags, pch, cpp, objects, so)
    log.debug("mps_emulated build: %s", " ".join(cmd))
    return subprocess.run(cmd, capture_output=True, text=True)


def undefined_symbols(so: Path) -> list[tuple[str, str]]:
    """``(name, version)`` of every undefined dynamic symbol of ``so`` (weak ones excluded)."""
    nm = shutil.which("nm")
    if nm is None:
        raise MpsEmulatedBuildError("checking the mps_emulated .so needs nm (binutils)")
    proc = subprocess.run([nm, "-D", "--undefined-only", str(so)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise MpsEmulatedBuildError(f"{so}: not a readable shared object ({proc.stderr.strip()})")
    found = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) != 2 or parts[0] != "U":  # "w" = weak, resolved or not
            continue
        name, _, version = parts[1].partition("@")
        found.append((name, version.lstrip("@")))
    return found


def unexpected_symbols(symbols: list[tuple[str, str]]) -> list[str]:
    """The symbols neither the AOTI shims nor the C/C++ runtime libraries provide."""
    return sorted(
        name + (f"@{version}" if version else "")
        for name, version in symbols
        if not name.startswith("aoti_torch_") and not version.startswith(_SYSTEM_VERSIONS)
    )


def check_undefined_symbols(so: Path) -> list[tuple[str, str]]:
    """Fail unless ``so`` needs only ``aoti_torch_*`` and libc/libstdc++/libgcc symbols."""
    symbols = undefined_symbols(so)
    bad = unexpected_symbols(symbols)
    if bad:
        raise MpsEmulatedBuildError(
            f"the mps_emulated .so {so} needs symbols no etmetal shim or system library "
            f"provides: {', '.join(bad[:20])}{' ...' if len(bad) > 20 else ''} (a libtorch "
            "or CUDA dependency leaked into the Metal wrapper)"
        )
    return symbols


def host_can_compile() -> tuple[bool, str]:
    """Whether this host can build the emulated Metal target: Inductor's mps codegen, the
    Metal headers the wrapper includes, and a C++ compiler for the wrapper."""
    try:
        import torch._inductor.codegen.mps  # noqa: F401  (the Metal code generator)
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
