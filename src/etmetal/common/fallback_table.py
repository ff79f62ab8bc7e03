"""The fallback-shim table: which AOTI C-shim fallbacks (``aoti_torch_<device>_<op>``) the
runtime of each Metal target provides.

AOTInductor compiles most operators to generated code; the rest become calls into a
C-shim fallback that the runtime must implement. The partitioner delegates a node only if
every fallback it may take is listed here for the target, and etmetal's shim registry
implements exactly the fallbacks listed here, so the two cannot drift apart.

``host`` runs on etmetal's shims (CPU ATen); ``mps`` lists what ExecuTorch's Metal
runtime implements (etmetal's shims serve those names too). A target may list fallbacks
that only etmetal's runtime adds (the emulated Metal device's scans): a program lowered with
``runtime="etmetal"`` may call them, one for the target's own runtime may not. The rows
come from the target records (``common.targets``): adding a target is one record there.
"""

from __future__ import annotations

from .custom_ops import CUSTOM_OP_NAMES
from .targets import ETMETAL_RUNTIME, RUNTIMES, TARGETS, UPSTREAM_RUNTIME, MetalTarget, get_target

__all__ = [
    "DEFAULT_RUNTIME",
    "ETMETAL_FALLBACKS",
    "ETMETAL_RUNTIME",
    "FALLBACKS",
    "PROXY_EXECUTOR_SHIM",
    "RUNTIMES",
    "UPSTREAM_RUNTIME",
    "all_fallback_shims",
    "etmetal_fallback_shims",
    "fallback_shims",
    "runtime_shims",
    "shim_name",
]

# target -> (device in the shim names, fallback ops its runtime implements), read from the
# target records plus the custom (non-ATen) operators every target runs as named shims:
# torchao's int4 linear and upstream's Metal MoE / linear-attention ops
# (declared in etmetal.common.custom_ops)
FALLBACKS: dict[str, tuple[str, frozenset[str]]] = {
    name: (t.shim_prefix, t.fallbacks | CUSTOM_OP_NAMES) for name, t in TARGETS.items()
}


def shim_name(device: str, op: str) -> str:
    """The C symbol of ``op``'s fallback on ``device`` (``cpu``, ``mps``)."""
    return f"aoti_torch_{device}_{op}"


def fallback_shims(target: MetalTarget | str) -> frozenset[str]:
    """The C symbols of every fallback ``target``'s runtime implements."""
    device, ops = FALLBACKS[get_target(target).name]
    return frozenset(shim_name(device, op) for op in ops)


# target -> (device in the shim names, fallback ops etmetal's runtime adds for it): the
# records' ``etmetal_fallbacks``, allowed only in programs lowered with runtime="etmetal"
ETMETAL_FALLBACKS: dict[str, tuple[str, frozenset[str]]] = {
    name: (t.shim_prefix, t.etmetal_fallbacks) for name, t in TARGETS.items()
}


def etmetal_fallback_shims(target: MetalTarget | str) -> frozenset[str]:
    """The C symbols of the fallbacks etmetal's runtime adds to ``target``'s own."""
    device, ops = ETMETAL_FALLBACKS[get_target(target).name]
    return frozenset(shim_name(device, op) for op in ops)


def all_fallback_shims() -> dict[str, str]:
    """Every fallback symbol of any target and runtime -> its op name."""
    rows = (*FALLBACKS.values(), *ETMETAL_FALLBACKS.values())
    return {shim_name(device, op): op for device, ops in rows for op in ops}


# --- which runtime a program targets (``MetalPartitioner(runtime=...)``) ------------------
# An operator Inductor leaves to ATen without a C shim in torch's ABI (a custom op, an ATen
# op torch has no shim for) becomes a call to the proxy executor, with the operator named
# in the partition's extern-node table. etmetal's runtime has a proxy executor, so for it
# every such operator is one more fallback it provides; upstream's device runtimes have
# none, so for them such operators stay out of the delegate.
PROXY_EXECUTOR_SHIM = "aoti_torch_proxy_executor_call_function"
# the runtime a target's programs are for unless the user says otherwise (the records say)
DEFAULT_RUNTIME = {name: t.default_runtime for name, t in TARGETS.items()}


def runtime_shims(target: MetalTarget | str, runtime: str) -> frozenset[str]:
    """Every fallback symbol a ``.so`` for ``target`` may call when ``runtime`` runs it: the
    target's row of :data:`FALLBACKS`, plus, on etmetal's runtime, the proxy executor and
    the target's row of :data:`ETMETAL_FALLBACKS`."""
    if runtime != ETMETAL_RUNTIME:
        return fallback_shims(target)
    return fallback_shims(target) | etmetal_fallback_shims(target) | {PROXY_EXECUTOR_SHIM}
