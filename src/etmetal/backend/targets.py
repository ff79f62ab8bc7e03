"""Compile targets of the Metal delegate: which device AOTInductor generates code for.

``mps`` generates Metal kernels and needs macOS with an MPS device at lowering time
(Inductor compiles against the device). ``host`` generates C++ for the CPU and works
on any machine with a C++ compiler; its ``.so`` calls the same AOTI shim ABI, which
etmetal's runtime provides. ``mps_emulated`` runs Inductor's real ``mps`` code
generation on any machine and builds the Metal wrapper for this CPU; its ``.so`` calls
the Metal shim ABI (``aoti_torch_mps_*``), which etmetal's emulated Metal device serves.
``auto`` picks ``mps`` where it is usable, else ``host`` (never ``mps_emulated``: it is
a test vehicle for the real Metal artifact, not the fast way to run on a CPU).
"""

from __future__ import annotations

import logging
import platform

import torch

from etmetal.common.fallback_table import DEFAULT_RUNTIME, ETMETAL_RUNTIME, RUNTIMES

log = logging.getLogger(__name__)

HOST = "host"
MPS = "mps"
MPS_EMULATED = "mps_emulated"
AUTO = "auto"
TARGETS = (HOST, MPS, MPS_EMULATED)
CHOICES = (AUTO, HOST, MPS, MPS_EMULATED)

# compile spec keys the partitioner writes and preprocess reads
TARGET_SPEC_KEY = "target"
RUNTIME_SPEC_KEY = "runtime"
METHOD_NAME_SPEC_KEY = "method_name"
CODESIGN_SPEC_KEY = "codesign_identity"


def mps_available() -> bool:
    return platform.system() == "Darwin" and torch.backends.mps.is_available()


def device_of(target: str) -> str:
    """The torch device type AOTInductor compiles ``target`` for (also the shim prefix)."""
    check_target(target)
    return "mps" if target in (MPS, MPS_EMULATED) else "cpu"


def check_target(target: object) -> str:
    """Validate a resolved target name (``host``, ``mps`` or ``mps_emulated``)."""
    if target not in TARGETS:
        raise ValueError(
            f"unknown Metal target {target!r}; expected one of {', '.join(map(repr, CHOICES))}"
        )
    return str(target)


def resolve_target(target: object = AUTO) -> str:
    """Turn a user's ``target`` into a target name, failing at once when unusable."""
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
    if target == MPS and not mps_available():
        raise RuntimeError(
            "MetalPartitioner(target='mps') needs macOS with an MPS device: AOTInductor "
            f"compiles Metal kernels against the device, and this machine is {platform.system()} "
            f"(torch.backends.mps.is_available() is {torch.backends.mps.is_available()}). "
            "Use target='mps_emulated' to generate the same Metal code here and run it on "
            "etmetal's emulated Metal device, target='host' to compile the delegate for this "
            "machine's CPU, or lower on a Mac."
        )
    return target


def resolve_runtime(runtime: object, target: str) -> str:
    """The runtime a ``target`` program is lowered for: ``etmetal`` (its proxy executor runs
    operators without a C shim) or ``upstream`` (ExecuTorch's device runtime; such
    operators stay out); None picks the target's default (``DEFAULT_RUNTIME``)."""
    if runtime is None:
        return DEFAULT_RUNTIME[target]
    if runtime not in RUNTIMES:
        raise ValueError(
            f"unknown Metal runtime {runtime!r}; expected one of {', '.join(map(repr, RUNTIMES))} "
            "(etmetal: etmetal's runtime, which runs operators without a C shim through its "
            "proxy executor; upstream: ExecuTorch's Metal runtime, which cannot)"
        )
    if target == MPS and runtime == ETMETAL_RUNTIME:
        raise ValueError(
            "target='mps' programs run on ExecuTorch's Metal runtime (runtime='upstream'); "
            "etmetal's runtime runs host and mps_emulated programs"
        )
    return str(runtime)
