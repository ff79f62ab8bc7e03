"""The Metal delegate's targets, one frozen record each: the only place a target is spelled.

A target says which device AOTInductor generates code for and what runs the result:

- ``host``: C++ for this machine's CPU, on any OS with a C++ compiler; its ``.so`` calls
  the AOTI C-shim ABI (``aoti_torch_cpu_*`` fallbacks), which etmetal's runtime provides.
- ``mps``: Metal kernels; needs macOS with an MPS device at lowering time (Inductor
  compiles against the device) and runs on ExecuTorch's Metal runtime.
- ``mps_emulated``: Inductor's real ``mps`` code generation on any machine, the Metal
  wrapper built for this CPU; its ``.so`` calls the Metal shim ABI
  (``aoti_torch_mps_*``), which etmetal's emulated Metal device serves.

Ahead-of-time code (``backend/``, ``layout/``) and runtime code (``runtime/``, ``shims/``)
both read these records, so a target is added here, once, and nowhere else. The torch
device strings (``cpu``, ``mps``) live here too, as ``CPU_DEVICE`` and ``METAL_DEVICE``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# torch's device types: what Inductor compiles for and a model container is created on
CPU_DEVICE = "cpu"
METAL_DEVICE = "mps"

# the runtimes a program can be lowered for (``MetalPartitioner(runtime=...)``)
ETMETAL_RUNTIME = "etmetal"
UPSTREAM_RUNTIME = "upstream"
RUNTIMES = (ETMETAL_RUNTIME, UPSTREAM_RUNTIME)

# compile-spec keys the partitioner writes and preprocess reads (exir's CompileSpec keys)
TARGET_SPEC_KEY = "target"
RUNTIME_SPEC_KEY = "runtime"
METHOD_NAME_SPEC_KEY = "method_name"
CODESIGN_SPEC_KEY = "codesign_identity"
SHARE_WEIGHTS_KEY = "share_weights"
SHARE_MUTABLE_BUFFERS_KEY = "share_mutable_buffers"
COMPILE_SPEC_KEYS = (
    TARGET_SPEC_KEY,
    RUNTIME_SPEC_KEY,
    METHOD_NAME_SPEC_KEY,
    CODESIGN_SPEC_KEY,
    SHARE_WEIGHTS_KEY,
    SHARE_MUTABLE_BUFFERS_KEY,
)

# the user's "pick for me" target: mps where usable, else host (never mps_emulated, a test
# vehicle for the real Metal artifact, not the fast way to run on a CPU)
AUTO = "auto"

# pools Inductor leaves to ATen (large overlapping windows, odd output sizes) that torch's
# C-shim ABI declares on both devices (``c_shim_mps.h`` has no 3-d adaptive pool)
_POOLS = frozenset({"avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d", "max_pool2d_with_indices"})
# fallbacks every target's runtime implements: matrix products and convolution leave
# Inductor by design, top-k on most shapes
_EVERYWHERE = frozenset({"mm_out", "addmm_out", "bmm_out", "convolution", "topk"})
_HOST_FALLBACKS = _EVERYWHERE | {
    "baddbmm_out",
    # Inductor routes CPU scaled-dot-product attention here (math semantics)
    "_scaled_dot_product_flash_attention_for_cpu",
    *_POOLS,
    "_adaptive_avg_pool3d",
    # Inductor's CPU decomposition of aten.lstm runs each layer in oneDNN
    "mkldnn_rnn_layer",
    # scans Inductor leaves to ATen (bool/integer inputs: HF decoders' position ids)
    "cumsum",
    "cumprod",
    "logcumsumexp",
}
# every scan Inductor may leave to a C-shim fallback (``lowering.py``'s fallback_cumsum,
# ...): Metal code generation has no scan kernels, so on mps each of them is a fallback
_SCANS = frozenset({"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"})
# what ExecuTorch's Metal runtime implements (etmetal's shims serve those names too)
_METAL_FALLBACKS = _EVERYWHERE | {
    "_scaled_dot_product_attention_math_for_mps",
    "_scaled_dot_product_attention_math_for_mps_v2",
}


@dataclass(frozen=True)
class MetalTarget:
    """One compile target of the Metal delegate."""

    name: str
    # the torch device type AOTInductor compiles for
    torch_device: str
    # the fallback ops its runtime implements (ATen ops; custom ops are added in
    # ``fallback_table``, which owns that list)
    fallbacks: frozenset[str]
    # the runtime its programs are for unless the user says otherwise
    default_runtime: str
    # etmetal compiles it on any machine (``mps`` needs macOS with an MPS device)
    compiles_anywhere: bool
    # etmetal's runtime runs its ``.so`` (``mps`` runs on ExecuTorch's Metal runtime)
    etmetal_runs: bool
    # the compile-spec keys a partition for it may carry
    compile_spec_keys: tuple[str, ...] = COMPILE_SPEC_KEYS
    # fallback ops etmetal's runtime adds to ``fallbacks`` for programs lowered for it
    # (``runtime="etmetal"``): its shims serve them, the target's own runtime does not
    etmetal_fallbacks: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return self.name

    # every target so far runs its container on the device it compiles for, and names its
    # fallback shims after it; a target that ever differs makes these fields
    @property
    def container_device(self) -> str:
        """The device string a model container is created on (``AotiModel(device=...)``)."""
        return self.torch_device

    @property
    def shim_prefix(self) -> str:
        """The device in the names of its C-shim fallbacks: ``aoti_torch_<prefix>_<op>``."""
        return self.torch_device


HOST = MetalTarget(
    name="host",
    torch_device=CPU_DEVICE,
    fallbacks=_HOST_FALLBACKS,
    # a host .so runs only in etmetal's runtime
    default_runtime=ETMETAL_RUNTIME,
    compiles_anywhere=True,
    etmetal_runs=True,
)
MPS = MetalTarget(
    name="mps",
    torch_device=METAL_DEVICE,
    fallbacks=_METAL_FALLBACKS,
    default_runtime=UPSTREAM_RUNTIME,
    compiles_anywhere=False,
    etmetal_runs=False,
)
# the Mac's target as etmetal builds and runs it on any machine: the same device, fallbacks
# and predictions (its programs stand for mps programs), Inductor's real Metal code run by
# etmetal's emulated Metal device
MPS_EMULATED = replace(
    MPS,
    name="mps_emulated",
    compiles_anywhere=True,
    etmetal_runs=True,
    # a Mac's Metal runtime has no scans or pools; etmetal's emulated device runs them
    etmetal_fallbacks=_SCANS | _POOLS,
)

TARGETS: dict[str, MetalTarget] = {t.name: t for t in (HOST, MPS, MPS_EMULATED)}
TARGET_NAMES = tuple(TARGETS)
CHOICES = (AUTO, *TARGET_NAMES)
# the targets whose programs etmetal's runtime runs
RUNNABLE_TARGETS = tuple(t for t in TARGETS.values() if t.etmetal_runs)


def get_target(target: MetalTarget | str) -> MetalTarget:
    """The record of ``target`` (a record or a target name); a ValueError naming the bad
    value and the choices otherwise. The one check of a target name."""
    if isinstance(target, MetalTarget):
        return target
    record = TARGETS.get(target) if isinstance(target, str) else None
    if record is None:
        hint = f" ({AUTO!r} is resolved to one of them first)" if target == AUTO else ""
        raise ValueError(
            f"unknown Metal target {target!r}; expected one of "
            f"{', '.join(map(repr, TARGET_NAMES))}{hint}"
        )
    return record
