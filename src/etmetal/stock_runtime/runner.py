"""The Python-free runner: ``etmetal_runner``, built from ``runner.cpp`` against the wheel's
ExecuTorch runtime, and the helper that drives it as a subprocess.

The executable links ``libexecutorch.so``, the stock kernels
(``libexecutorch_kernels_optimized.so``, kept with ``--no-as-needed`` since nothing
references it: its static initializers register the kernels) and ``libexecutorch_etdump.so``,
with the wheel's ``lib`` folder as its run path. It is an entry of the content cache
(:mod:`etmetal.common.native_build`), so it is built once per source and machine.

:func:`run_native` turns tensors into the raw input files the runner reads (laid out in
the dim order the method declares, which ``etmetal_runner --describe`` reports), runs it
and reads its outputs back as tensors. No Python runs in that process: that is the
device-side path.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from etmetal.common.native_build import WARNINGS, build_sources
from etmetal.common.scalar_types import SCALAR_TYPE_CODES

from .register import msl_settings

__all__ = [
    "EXIT_CODES",
    "describe",
    "NativeRunError",
    "RunnerResult",
    "executorch_compile_flags",
    "executorch_root",
    "libtorch_cpu_path",
    "run_native",
    "run_runner",
    "runner_path",
    "trust_environment",
]

_HERE = Path(__file__).resolve().parent
_SOURCES = ("runner.cpp", "runner_io.cpp", "runner_options.cpp")
_HEADERS = ("runner_io.h", "runner_options.h")

TIMEOUT_CODE = 124  # ours, as coreutils' timeout reports it: the runner never exits with it
# ExitCode in runner_io.h
EXIT_CODES: dict[int, str] = {
    2: "usage",
    3: "missing file",
    4: "program load failed",
    5: "no such method",
    6: "load_method failed",
    7: "bad input",
    8: "execute failed",
    9: "write failed",
    10: "backend library failed to load",
    TIMEOUT_CODE: "timed out (killed)",
}

_DTYPES = {
    code: getattr(torch, name)
    for name, code in SCALAR_TYPE_CODES.items()
    if isinstance(getattr(torch, name, None), torch.dtype)
}


class NativeRunError(RuntimeError):
    """``etmetal_runner`` exited with an error; ``code`` is its exit code, ``stderr`` its
    message (which names the file, input index, method or ExecuTorch error)."""

    def __init__(self, code: int, stderr: str, command: Sequence[str]) -> None:
        self.code = code
        self.stderr = stderr
        self.command = list(command)
        kind = EXIT_CODES.get(code, f"killed by signal {-code}" if code < 0 else f"exit {code}")
        super().__init__(f"etmetal_runner: {kind} (exit {code}): {stderr.strip()}")


def executorch_root() -> Path:
    """The installed ExecuTorch wheel's folder (holding ``include/`` and ``lib/``)."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise NativeRunError(3, "the executorch package is not installed", [])
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / "lib" / "libexecutorch.so").is_file():
        raise NativeRunError(3, f"{root} ships no lib/libexecutorch.so", [])
    return root


def executorch_compile_flags(root: Path | None = None) -> tuple[str, ...]:
    """What a C++ source including the wheel's headers compiles with: the definitions the
    wheel's libraries were built with (its CMake config names them; without the event
    tracer one, profiling scopes silently record nothing) and its include folders, as
    system headers so our warning flags do not judge them."""
    root = root or executorch_root()
    include = root / "include"
    return (
        "-std=c++17",
        "-DC10_USING_CUSTOM_GENERATED_MACROS",
        "-DET_EVENT_TRACER_ENABLED",
        "-isystem",
        str(include),
        "-isystem",
        str(include / "executorch/runtime/core/portable_type/c10"),
    )


@cache
def runner_path() -> Path:
    """The ``etmetal_runner`` executable, built on first use and verified from the cache."""
    root = executorch_root()
    lib = root / "lib"
    link = (
        f"-L{lib}",
        "-Wl,--no-as-needed",  # the kernels library is needed for what it registers
        "-lexecutorch",
        "-lexecutorch_kernels_optimized",
        "-lexecutorch_etdump",
        "-Wl,--as-needed",
        "-ldl",
        f"-Wl,-rpath,{lib}",
    )
    return build_sources(
        "stock_runner",
        "etmetal_runner",
        [_HERE / s for s in _SOURCES],
        [_HERE / h for h in _HEADERS],
        lang="c++",
        flags=("-O2", *WARNINGS, *executorch_compile_flags(root)),
        link=link,
        executable=True,
    )


def default_backend_libs() -> list[Path]:
    """etmetal's native MetalBackend library, when this package provides one."""
    import etmetal.stock_runtime as package

    library_path = getattr(package, "library_path", None)
    return [Path(library_path())] if library_path is not None else []


def libtorch_cpu_path() -> Path:
    """The libtorch_cpu etmetal's native fallbacks call (torch's own, next to this torch)."""
    from etmetal.shims import native_fallbacks

    return Path(native_fallbacks.libtorch_cpu_path())


def proxy_lib_path() -> Path:
    """etmetal's proxy library (built if needed): it runs a delegate's extern-node table."""
    from etmetal.shims import proxy_native

    return Path(proxy_native.library_path())


@dataclass
class RunnerResult:
    outputs: list
    manifest: dict
    summary: str
    inputs: list = field(default_factory=list)


def trust_environment(
    trust_native_code: bool, trusted_blob_hashes: Sequence[str]
) -> dict[str, str]:
    """This process's environment with the trust policy in the variables etmetal's
    backends read (etmetal.runtime and the native MetalBackend), for the runner."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ETMETAL_TRUST_NATIVE_CODE", "ETMETAL_TRUSTED_BLOBS")
    }
    if trust_native_code:
        env["ETMETAL_TRUST_NATIVE_CODE"] = "1"
    if trusted_blob_hashes:
        env["ETMETAL_TRUSTED_BLOBS"] = ",".join(trusted_blob_hashes)
    return env


def _invoke(args: Sequence[str], env: Mapping[str, str], timeout: float) -> str:
    command = [str(runner_path()), *args]
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, env=dict(env), timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise NativeRunError(TIMEOUT_CODE, f"timed out after {timeout} s", command) from exc
    if proc.returncode != 0:
        raise NativeRunError(proc.returncode, proc.stderr, command)
    return proc.stdout


def describe(pte_path: str | os.PathLike, method: str = "forward", timeout: float = 60) -> dict:
    """The method's input specs as the stock runtime reads them (``--describe``)."""
    return json.loads(
        _invoke([str(pte_path), "--method", method, "--describe"], os.environ, timeout)
    )


def _read_tensor(entry: dict, directory: Path) -> torch.Tensor:
    dtype = _DTYPES[entry["scalar_type"]]
    sizes, order = entry["sizes"], entry["dim_order"]
    data = (directory / Path(entry["file"]).name).read_bytes()
    flat = torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(0, dtype=dtype)
    # the bytes are laid out in dim order: view them in that order, then permute back
    stored = flat.reshape([sizes[d] for d in order])
    return stored.permute([order.index(d) for d in range(len(order))]).contiguous()


def _value(entry: dict, directory: Path):
    kind = entry["kind"]
    if kind == "tensor":
        return _read_tensor(entry, directory)
    if kind == "none":
        return None
    if kind in ("int", "double", "bool"):
        return entry["value"]
    raise NativeRunError(8, f"output of an unsupported kind: {entry}", [])


def _input_bytes(index: int, value: torch.Tensor, spec: dict) -> bytes:
    if not isinstance(value, torch.Tensor):
        raise NativeRunError(
            7, f"input {index}: a tensor is expected, got {type(value).__name__}", []
        )
    dtype = _DTYPES[spec["scalar_type"]]
    if value.dtype != dtype or list(value.shape) != spec["sizes"]:
        raise NativeRunError(
            7,
            f"input {index}: {value.dtype} {list(value.shape)}, the method's input {index} is "
            f"{dtype} {spec['sizes']}",
            [],
        )
    laid_out = value.detach().cpu().permute(spec["dim_order"]).contiguous()
    return laid_out.view(torch.uint8).numpy().tobytes() if laid_out.numel() else b""


def run_runner(
    pte_path: str | os.PathLike,
    inputs: Sequence[torch.Tensor] | None = None,
    method: str = "forward",
    *,
    data_files: Sequence[str | os.PathLike] = (),
    backend_libs: Sequence[str | os.PathLike] | None = None,
    generate: str | None = None,
    iterations: int = 1,
    etdump: str | os.PathLike | None = None,
    dump_maps: str | os.PathLike | None = None,
    loader: str = "file",
    trust_native_code: bool = False,
    trusted_blob_hashes: Sequence[str] = (),
    timeout: float = 600,
) -> RunnerResult:
    """Run ``method`` of ``pte_path`` in ``etmetal_runner`` with the tensor ``inputs`` (one
    per tensor input, shaped and typed as the method declares) or inputs it generates
    (``generate="ones"`` or ``"seed:N"``, read back into :attr:`RunnerResult.inputs`).
    ``backend_libs`` defaults to etmetal's MetalBackend library when available. Raises
    :class:`NativeRunError` with the runner's message on any failure."""
    libs = default_backend_libs() if backend_libs is None else [Path(p) for p in backend_libs]
    env = trust_environment(trust_native_code, trusted_blob_hashes)
    # where an mps_emulated delegate's compiled shader libraries are, and what compiles a
    # missing one (a Python subprocess of the runner; the runner itself has no Python)
    env.update({k: v for k, v in msl_settings().items() if k not in os.environ})
    with tempfile.TemporaryDirectory(prefix="etmetal-runner-") as tmp:
        work = Path(tmp)
        args = [
            str(pte_path),
            "--method",
            method,
            "--output-dir",
            str(work / "out"),
            "--iterations",
            str(iterations),
            "--loader",
            loader,
        ]
        for lib in libs:
            args += ["--backend-lib", str(lib)]
        if libs:
            args += ["--libtorch-cpu", str(libtorch_cpu_path())]
            args += ["--proxy-lib", str(proxy_lib_path())]
        for path in data_files:
            args += ["--data", str(path)]
        if inputs is not None:
            specs = [
                s for s in describe(pte_path, method, timeout)["inputs"] if s["kind"] == "tensor"
            ]
            if len(inputs) != len(specs):
                raise NativeRunError(
                    7,
                    f"{len(inputs)} input(s) given, method '{method}' has {len(specs)} "
                    "tensor input(s)",
                    [],
                )
            for i, (value, spec) in enumerate(zip(inputs, specs)):
                path = work / f"input_{i}.bin"
                path.write_bytes(_input_bytes(i, value, spec))
                args += ["--input", str(path)]
        elif generate is not None:
            args += ["--generate-inputs", generate]
        if etdump is not None:
            args += ["--etdump", str(etdump)]
        if dump_maps is not None:
            args += ["--dump-maps", str(dump_maps)]
        summary = _invoke(args, env, timeout).strip()
        out = work / "out"
        manifest = json.loads((out / "manifest.json").read_text())
        outputs = [_value(e, out) for e in manifest["outputs"]]
        generated = (
            [] if inputs is not None else [_value(e["value"], out) for e in manifest["inputs"]]
        )
    return RunnerResult(outputs=outputs, manifest=manifest, summary=summary, inputs=generated)


def run_native(
    pte_path: str | os.PathLike,
    inputs: Sequence[torch.Tensor] | None = None,
    method: str = "forward",
    **options,
) -> list:
    """The outputs of ``method`` of ``pte_path`` run by ``etmetal_runner`` on ``inputs``
    (see :func:`run_runner` for the options)."""
    return run_runner(pte_path, inputs, method, **options).outputs
