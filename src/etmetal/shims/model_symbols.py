"""What a model's ``.so`` binds to: the ``aoti_torch_*`` shims it leaves undefined, which
etmetal's bridge must serve; the vector math it calls without defining; and the link
group (bridge, vector math, model) its loader wrapper names, in that order."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .bridge import Bridge, BridgeError
from .model_link import NativeBuildError, undefined_symbols
from .model_run import AotiModelError
from .proxy_native import PROXY_SHIM


def undefined_shims(so_path: str | os.PathLike) -> set[str] | None:
    """The ``aoti_torch_*`` symbols ``so_path`` leaves undefined (None if ``nm`` is missing)."""
    try:
        return undefined_symbols(so_path, "aoti_")
    except NativeBuildError as exc:
        raise AotiModelError(str(exc)) from exc


def _vector_math_libraries(so_path: Path) -> list[Path]:
    """Libraries that define the vector math a host ``.so`` calls without defining it.

    Inductor's vectorized CPU kernels call SLEEF (``Sleef_expf8_u10`` for ``exp`` in
    softmax, GELU, SiLU), which libtorch_cpu carries; a ``link_libtorch=False`` build
    leaves those symbols undefined. torch has libtorch_cpu loaded already (RTLD_LOCAL), so
    naming it in the model's link group, after the bridge, resolves them to that copy
    without letting any of its ``aoti_torch_*`` shadow etmetal's.
    """
    try:
        sleef = undefined_symbols(so_path, "Sleef_")
    except NativeBuildError as exc:
        raise AotiModelError(str(exc)) from exc
    if not sleef:
        return []
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    if not lib.exists():
        raise AotiModelError(
            f"{so_path.name} calls SLEEF vector math ({sorted(sleef)[0]}, ...) and this torch "
            f"has no {lib.name} to provide it"
        )
    return [lib]


def model_link_group(bridge_path: Path, so_path: Path) -> list[Path]:
    """The objects a model's link wrapper names, in order: the bridge first (its
    ``aoti_torch_*`` serve the model), then the vector math the ``.so`` calls, then the
    ``.so`` itself."""
    return [bridge_path, *_vector_math_libraries(so_path), so_path]


def check_needed_shims(so_path: Path, bridge: Bridge, has_extern_nodes: bool) -> set[str] | None:
    """The shims ``so_path`` needs (None when ``nm`` is missing: nothing is checked), after
    checking that ``bridge`` exports each of them, that a ``.so`` calling the proxy executor
    comes with its extern-node table, and that no library in the process-wide scope would
    take one of them from the bridge."""
    needed = undefined_shims(so_path)
    if needed is None:
        return None
    missing = sorted(needed - bridge.exported)
    if missing:
        raise AotiModelError(f"{so_path.name} needs shims etmetal does not implement: {missing}")
    if PROXY_SHIM in needed and not has_extern_nodes:
        raise AotiModelError(
            f"{so_path.name} runs operators without a C shim through the proxy "
            "executor and needs its extern-node table (AotiModel(..., extern_nodes=...))"
        )
    shadowed = bridge.shadowed(needed)
    if shadowed:
        raise BridgeError(
            f"{so_path.name} would bind {shadowed} to a library loaded into the "
            "process-wide (RTLD_GLOBAL) scope, not to etmetal"
        )
    return needed
