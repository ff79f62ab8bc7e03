"""AOTInductor compilation of an ExportedProgram, behind a content-addressed cache.

A cold AOTI compile takes tens of seconds, so every caller (preprocess, tests,
benchmarks) goes through :func:`compile_exported_program`, which keys the result by
everything that can change the generated code: the graph, the example input specs,
the constant values, the target, the compile options, the torch version and, for
``host``, the intra-op thread count Inductor's C++ kernels are generated for.
The entries live in :mod:`etmetal.common.cache` (kind ``aoti``): concurrent processes
(pytest-xdist workers) compiling the same key wait on its file lock instead of compiling
twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from etmetal.common.cache import ContentCache
from etmetal.common.targets import HOST, MPS, MPS_EMULATED, MetalTarget, get_target

from . import aoti_runtime_object, input_checks
from .aoti_runtime_object import shared_runtime_in_inductor_builds
from .extern_nodes import PROXY_EXECUTOR_SHIM, dtype_annotated_tables, find_extern_nodes, read_table

log = logging.getLogger(__name__)

# bump when the layout of a cache entry or the compile recipe changes
_CACHE_FORMAT = 1
# the entry's copy of Inductor's extern-node table (only when the .so calls the proxy executor)
EXTERN_NODES_FILE = "extern_nodes.json"


# seconds between progress reports while Inductor compiles
HEARTBEAT_SECONDS = float(os.environ.get("ETMETAL_PROGRESS_SECONDS", "5"))

# this process's compiles and cache hits; tests assert on these instead of on time
_STATS: Counter[str] = Counter()


def compile_stats() -> dict[str, int]:
    """``{"compiles": n, "cache_hits": m}`` for this process."""
    return {"compiles": _STATS["compiles"], "cache_hits": _STATS["cache_hits"]}


@contextlib.contextmanager
def _progress(label: str) -> Iterator[None]:
    """Report that a compile is still running: a tqdm counter of seconds on a terminal,
    else a log line every ``HEARTBEAT_SECONDS`` (silent for fast compiles)."""
    done = threading.Event()
    start = time.monotonic()
    bar = None
    if sys.stderr.isatty() and os.environ.get("ETMETAL_PROGRESS", "1") != "0":
        try:
            from tqdm import tqdm

            bar = tqdm(desc=label, unit="s", bar_format="{desc}: {elapsed}", leave=False)
        except ImportError:
            bar = None

    def beat() -> None:
        while not done.wait(1.0 if bar is not None else HEARTBEAT_SECONDS):
            if bar is not None:
                bar.update(1)
            else:
                log.info("%s: still compiling, %.0f s elapsed", label, time.monotonic() - start)

    thread = threading.Thread(target=beat, name="etmetal-aoti-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if bar is not None:
            bar.close()
        log.info("%s: done in %.1f s", label, time.monotonic() - start)


def aoti_options(*, link_libtorch: bool = False, extra: dict[str, Any] | None = None) -> dict:
    """Inductor options for a delegate build: weights outside the .so, no libtorch."""
    options: dict[str, Any] = {
        "aot_inductor.link_libtorch": link_libtorch,
        "aot_inductor.package": True,
        "aot_inductor.package_constants_in_so": False,
        "aot_inductor.package_constants_on_disk_format": "binary_blob",
        # padded strides would make the .so's buffers disagree with the program's specs
        "padding_stride_threshold": float("inf"),
    }
    options.update(extra or {})
    return options


@dataclass(frozen=True)
class AotiArtifact:
    """One compiled partition as it sits in the cache."""

    key: str
    so_path: Path
    weights_path: Path
    wrapper_cpp_path: Path | None
    from_cache: bool
    # the extern-node table the .so's proxy executor calls index (None: it makes none)
    extern_nodes_path: Path | None = None

    def so_bytes(self) -> bytes:
        return self.so_path.read_bytes()

    def extern_nodes_bytes(self) -> bytes | None:
        return read_table(self.extern_nodes_path)

    def weights_bytes(self) -> bytes:
        return self.weights_path.read_bytes()


def _hash_tensor(h: Any, name: str, value: Any) -> None:
    h.update(name.encode())
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}{tuple(value.stride())}".encode())
        if t.numel():
            flat = t.reshape(-1)  # 1-d first: a 0-d tensor cannot be viewed as bytes
            h.update(
                flat.view(torch.uint8).numpy().tobytes()
                if flat.dtype != torch.bool
                else flat.numpy().tobytes()
            )
    else:
        h.update(repr(value).encode())


def _spec_of(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"T({value.dtype},{tuple(value.shape)},{tuple(value.stride())},{value.device.type})"
    return repr(value)


def _graph_code(ep: torch.export.ExportedProgram) -> str:
    """The graph's code (ops, arguments, dtypes and shapes) without its comment lines.

    FX prints each node's Python source above it (``# File: /path/model.py:12 in forward,
    code: ...``): where the model was written, not what it computes. Keyed with it, the
    same program missed the cache in every checkout, in every test file that defines the
    same module, and after any edit above a model's class."""
    code = ep.graph_module.print_readable(print_output=False)
    return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))


def cache_key(
    ep: torch.export.ExportedProgram, target: MetalTarget | str, options: dict[str, Any]
) -> str:
    """Content hash of everything that determines the compiled artifact."""
    h = hashlib.sha256()
    h.update(f"etmetal-aoti-{_CACHE_FORMAT}|{torch.__version__}|{target}".encode())
    h.update(_graph_code(ep).encode())
    h.update(str(ep.graph_signature).encode())
    h.update(str(sorted(ep.range_constraints.items(), key=str)).encode())
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            h.update(f"{node.name}:{_spec_of(node.meta.get('val'))}".encode())
    for name, value in sorted(ep.state_dict.items()):
        _hash_tensor(h, name, value)
    for name, value in sorted(ep.constants.items()):
        _hash_tensor(h, name, value)
    h.update(json.dumps(options, sort_keys=True, default=repr).encode())
    return h.hexdigest()


def _user_input_examples(ep: torch.export.ExportedProgram) -> tuple[Any, ...]:
    names = set(ep.graph_signature.user_inputs)
    return tuple(n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder" and n.name in names)


def compile_exported_program(
    ep: torch.export.ExportedProgram,
    *,
    target: MetalTarget | str = HOST,
    link_libtorch: bool = False,
    extra_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
) -> AotiArtifact:
    """Compile ``ep`` with AOTInductor for ``target``, cached by content.

    ``host`` = CPU C++; ``mps`` = Metal (macOS with MPS only, fails here otherwise);
    ``mps_emulated`` = Metal code generated here, its wrapper built for this CPU (see
    :mod:`.mps_emulated_compile`). The ``.so`` is built with weights outside it
    (``weights.blob``) so they can be stored as named data. ``ep`` is not modified.
    """
    target = get_target(target)
    if not target.compiles_anywhere and not torch.backends.mps.is_available():
        raise RuntimeError(
            f"target {target.name!r} needs macOS with an MPS device "
            "(torch.backends.mps.is_available() is False here); use "
            f"target={MPS_EMULATED.name!r} to generate the Metal code on this machine, or "
            f"target={HOST.name!r} to compile for this machine's CPU"
        )
    if target is MPS_EMULATED and link_libtorch:
        raise ValueError(f"target {target.name!r} builds without libtorch (link_libtorch=False)")
    options = aoti_options(link_libtorch=link_libtorch, extra=extra_options)
    from .custom_ops import inductor_custom_shims

    custom = inductor_custom_shims(ep, target.torch_device)
    if custom:  # named C shims instead of libtorch's proxy executor
        options["aot_inductor.custom_ops_to_c_shims"] = custom
    key = cache_key(ep, target, _keyed_options(target, options))
    if not use_cache:  # a private directory the caller owns
        entry = Path(tempfile.mkdtemp(prefix="etmetal-aoti-"))
        try:
            _compile_into(ep, target, options, key, entry)
        except BaseException:  # nothing half-written is left behind
            shutil.rmtree(entry, ignore_errors=True)
            raise
        return _artifact(key, entry, from_cache=False)
    cache = ContentCache("aoti", cache_dir)
    entry, hit = cache.get_or_create(
        key, lambda tmp: _compile_into(ep, target, options, key, tmp), stamp=key
    )
    if hit and _lacks_extern_nodes(entry):
        # an entry from before the extern-node table was kept: compile it again
        entry, hit = cache.get_or_create(
            key, lambda tmp: _compile_into(ep, target, options, key, tmp), stamp=key, refresh=True
        )
    if hit:
        log.info("AOTI cache hit %s", key[:12])
        _STATS["cache_hits"] += 1
    return _artifact(key, entry, from_cache=hit)


def _lacks_extern_nodes(entry: Path) -> bool:
    """True for a cached ``.so`` that calls the proxy executor but has no table next to it."""
    if (entry / EXTERN_NODES_FILE).exists():
        return False
    so = entry / "model.so"
    return so.exists() and PROXY_EXECUTOR_SHIM.encode() in so.read_bytes()


def _artifact(key: str, entry: Path, from_cache: bool) -> AotiArtifact:
    cpp = entry / "wrapper.cpp"
    table = entry / EXTERN_NODES_FILE
    return AotiArtifact(
        key,
        entry / "model.so",
        entry / "weights.blob",
        cpp if cpp.exists() else None,
        from_cache,
        table if table.exists() else None,
    )


def _keyed_options(target: MetalTarget, options: dict[str, Any]) -> dict[str, Any]:
    """The options plus etmetal's own changes to the build, which Inductor never sees."""
    keyed = dict(options)
    custom = options.get("aot_inductor.custom_ops_to_c_shims")
    if custom:  # operator keys are not JSON: key by their names
        keyed["aot_inductor.custom_ops_to_c_shims"] = {str(op): d for op, d in custom.items()}
    if not options.get("aot_inductor.link_libtorch"):
        keyed["etmetal.input_checks"] = input_checks.RECIPE
        if aoti_runtime_object.enabled():
            keyed["etmetal.shared_aoti_runtime"] = aoti_runtime_object.FORMAT
    if target is HOST:
        # Inductor's C++ kernels bake the intra-op thread count in (their OpenMP regions and
        # how reductions are split), so one program compiled under 1 and 2 threads rounds
        # differently: an artifact is only reproducible if the count is part of its key.
        from torch._inductor.utils import parallel_num_threads

        keyed["etmetal.cpp_kernel_threads"] = parallel_num_threads()
    if target is MPS_EMULATED:
        from .mps_emulated_compile import BUILD_RECIPE

        keyed["etmetal.mps_emulated_build"] = BUILD_RECIPE
    return keyed


def _compile_into(
    ep: torch.export.ExportedProgram, target: MetalTarget, options: dict, key: str, entry: Path
) -> None:
    """Compile ``ep`` and write ``model.so``, ``weights.blob`` (and ``wrapper.cpp``) into
    the directory ``entry``."""
    log.info("AOTI compiling %s for %s (takes tens of seconds)", key[:12], target)
    _STATS["compiles"] += 1
    # etmetal's builds check their inputs on every run, with no environment variable;
    # torch's own runner builds (link_libtorch, the benchmarks' reference) stay stock
    checks = (
        contextlib.nullcontext()
        if options.get("aot_inductor.link_libtorch")
        else input_checks.inputs_always_checked()
    )
    with (
        _progress(f"AOTI compile {key[:12]} ({target})"),
        torch.no_grad(),
        dtype_annotated_tables(),
        checks,
    ):
        so, blob, cpp, table = _compile_target(ep, target, options, entry / "work")
    shutil.copy2(so, entry / "model.so")
    if table is not None:
        shutil.copy2(table, entry / EXTERN_NODES_FILE)
    if blob is not None:
        shutil.copy2(blob, entry / "weights.blob")
    else:  # a model without constants
        (entry / "weights.blob").write_bytes(b"")
    if cpp is not None:
        shutil.copy2(cpp, entry / "wrapper.cpp")
    shutil.rmtree(entry / "work", ignore_errors=True)


def _compile_target(
    ep: torch.export.ExportedProgram, target: MetalTarget, options: dict, work_dir: Path
) -> tuple[str, str | None, str | None, str | None]:
    """Paths of the ``.so``, the weights blob (None: no constants), the wrapper ``.cpp`` and
    the extern-node table (None: no operator goes through the proxy executor)."""
    if target is MPS_EMULATED:
        from .mps_emulated_compile import build_mps_emulated

        built = build_mps_emulated(ep, options, work_dir)
        weights = str(built.weights_path) if built.weights_path else None
        table = str(built.extern_nodes_path) if built.extern_nodes_path else None
        return str(built.so_path), weights, str(built.wrapper_cpp_path), table
    if target is MPS:
        ep = torch.export.passes.move_to_device_pass(ep, target.torch_device)
    # torch's own runner builds (link_libtorch, the benchmarks' reference) stay stock
    stock = options.get("aot_inductor.link_libtorch")
    with contextlib.nullcontext() if stock else shared_runtime_in_inductor_builds():
        paths = torch._inductor.aot_compile(ep.module(), _user_input_examples(ep), options=options)
    paths = paths if isinstance(paths, list) else [paths]
    so = next((p for p in paths if p.endswith(".wrapper.so")), None)
    blob = next((p for p in paths if p.endswith("_weights.blob")), None)
    cpp = next((p for p in paths if p.endswith(".wrapper.cpp")), None)
    if so is None:
        raise RuntimeError(f"AOTInductor produced no .so (got {paths})")
    return so, blob, cpp, find_extern_nodes(paths)
