"""Choosing a compile target ahead of time: ``auto`` resolved on this machine, ``mps``
refused where it cannot compile, and the runtime a program is lowered for.

The targets themselves are records in ``etmetal.common.targets`` (shared with the runtime);
this module only adds what needs torch and the machine (is MPS usable here?).
"""

from __future__ import annotations

import logging
import platform

import torch

from etmetal.common.targets import (
    AUTO,
    CHOICES,
    ETMETAL_RUNTIME,
    HOST,
    MPS,
    MPS_EMULATED,
    RUNTIMES,
    TARGET_NAMES,
    TARGETS,
    MetalTarget,
    get_target,
)

__all__ = [
    "AUTO",
    "CHOICES",
    "HOST",
    "MPS",
    "MPS_EMULATED",
    "TARGETS",
    "TARGET_NAMES",
    "MetalTarget",
    "get_target",
    "mps_available",
    "resolve_runtime",
    "resolve_target",
]

log = logging.getLogger(__name__)


def mps_available() -> bool:
    return platform.system() == "Darwin" and torch.backends.mps.is_available()


def resolve_target(target: object = AUTO) -> MetalTarget:
    """Turn a user's ``target`` (a name, ``auto`` or a record) into its record, failing at
    once when it is unknown or cannot compile on this machine."""
    if isinstance(target, MetalTarget):
        target = target.name
    if not isinstance(target, str) or target not in CHOICES:
        raise ValueError(
            f"unknown Metal target {target!r}; expected one of {', '.join(map(repr, CHOICES))} "
            "(auto picks mps where MPS is available, else host; mps_emulated runs the Metal "
            "code generation on any machine)"
        )
    if target == AUTO:
        chosen = MPS if mps_available() else HOST
        log.info(
            "MetalPartitioner: target auto -> %s (%s)",
            chosen,
            "MPS is available" if chosen == MPS else "no MPS device on this machine",
        )
        return chosen
    record = TARGETS[target]
    if not record.compiles_anywhere and not mps_available():
        raise RuntimeError(
            "MetalPartitioner(target='mps') needs macOS with an MPS device: AOTInductor "
            f"compiles Metal kernels against the device, and this machine is {platform.system()} "
            f"(torch.backends.mps.is_available() is {torch.backends.mps.is_available()}). "
            "Use target='mps_emulated' to generate the same Metal code here and run it on "
            "etmetal's emulated Metal device, target='host' to compile the delegate for this "
            "machine's CPU, or lower on a Mac."
        )
    return record


def resolve_runtime(runtime: object, target: MetalTarget | str) -> str:
    """The runtime a ``target`` program is lowered for: ``etmetal`` (its proxy executor runs
    operators without a C shim) or ``upstream`` (ExecuTorch's device runtime; such
    operators stay out); None picks the target's default (its record's ``default_runtime``)."""
    target = get_target(target)
    if runtime is None:
        return target.default_runtime
    if runtime not in RUNTIMES:
        raise ValueError(
            f"unknown Metal runtime {runtime!r}; expected one of {', '.join(map(repr, RUNTIMES))} "
            "(etmetal: etmetal's runtime, which runs operators without a C shim through its "
            "proxy executor; upstream: ExecuTorch's Metal runtime, which cannot)"
        )
    if runtime == ETMETAL_RUNTIME and not target.etmetal_runs:
        runnable = " and ".join(t.name for t in TARGETS.values() if t.etmetal_runs)
        raise ValueError(
            f"target={target.name!r} programs run on ExecuTorch's Metal runtime "
            f"(runtime='upstream'); etmetal's runtime runs {runnable} programs"
        )
    return str(runtime)
