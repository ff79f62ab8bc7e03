"""The fallback-shim table: which AOTI C-shim fallbacks (``aoti_torch_<device>_<op>``) the
runtime of each Metal target provides.

AOTInductor compiles most operators to generated code; the rest become calls into a
C-shim fallback that the runtime must implement. The partitioner delegates a node only if
every fallback it may take is listed here for the target, and etmetal's shim registry
implements exactly the fallbacks listed here, so the two cannot drift apart.

``host`` runs on etmetal's shims (CPU ATen); ``mps`` lists what ExecuTorch's Metal
runtime implements (etmetal's shims serve those names too). Adding a target is one line
in ``FALLBACKS``.
"""

from __future__ import annotations

from .custom_ops import CUSTOM_OP_NAMES

# fallbacks every target's runtime implements: matrix products and convolution leave
# Inductor by design, top-k on most shapes
_EVERYWHERE = frozenset({"mm_out", "addmm_out", "bmm_out", "convolution", "topk"})

# target -> (device in the shim names, fallback ops its runtime implements)
FALLBACKS: dict[str, tuple[str, frozenset[str]]] = {
    "host": (
        "cpu",
        _EVERYWHERE
        | {
            "baddbmm_out",
            # Inductor routes CPU scaled-dot-product attention here (math semantics)
            "_scaled_dot_product_flash_attention_for_cpu",
            # pools Inductor leaves to ATen (large overlapping windows, odd output sizes)
            "avg_pool2d",
            "avg_pool3d",
            "_adaptive_avg_pool2d",
            "_adaptive_avg_pool3d",
            "max_pool2d_with_indices",
            # Inductor's CPU decomposition of aten.lstm runs each layer in oneDNN
            "mkldnn_rnn_layer",
            # scans Inductor leaves to ATen (bool/integer inputs: HF decoders' position ids)
            "cumsum",
            "cumprod",
            "logcumsumexp",
        },
    ),
    "mps": (
        "mps",
        _EVERYWHERE
        | {
            "_scaled_dot_product_attention_math_for_mps",
            "_scaled_dot_product_attention_math_for_mps_v2",
        },
    ),
}
# the emulated Metal device predicts (and serves) exactly what a Mac's Metal runtime has
FALLBACKS["mps_emulated"] = FALLBACKS["mps"]

# custom (non-ATen) operators every target runs as named shims: torchao's int4 linear and
# upstream's Metal MoE / linear-attention ops (declared in etmetal.common.custom_ops)
FALLBACKS = {t: (device, ops | CUSTOM_OP_NAMES) for t, (device, ops) in FALLBACKS.items()}


def shim_name(device: str, op: str) -> str:
    """The C symbol of ``op``'s fallback on ``device`` (``cpu``, ``mps``)."""
    return f"aoti_torch_{device}_{op}"


def fallback_shims(target: str) -> frozenset[str]:
    """The C symbols of every fallback ``target``'s runtime implements."""
    device, ops = FALLBACKS[target]
    return frozenset(shim_name(device, op) for op in ops)


def all_fallback_shims() -> dict[str, str]:
    """Every fallback symbol of any target -> its op name."""
    return {shim_name(device, op): op for device, ops in FALLBACKS.values() for op in ops}


# --- which runtime a program targets (``MetalPartitioner(runtime=...)``) ------------------
# An operator Inductor leaves to ATen without a C shim in torch's ABI (a custom op, an ATen
# op torch has no shim for) becomes a call to the proxy executor, with the operator named
# in the partition's extern-node table. etmetal's runtime has a proxy executor, so for it
# every such operator is one more fallback it provides; upstream's device runtimes have
# none, so for them such operators stay out of the delegate.
PROXY_EXECUTOR_SHIM = "aoti_torch_proxy_executor_call_function"
ETMETAL_RUNTIME = "etmetal"
UPSTREAM_RUNTIME = "upstream"
RUNTIMES = (ETMETAL_RUNTIME, UPSTREAM_RUNTIME)
# the runtime a target's programs are for unless the user says otherwise: a host .so runs
# only in etmetal's runtime; mps programs are for ExecuTorch's Metal runtime, and
# mps_emulated stands for them (its predictions are the Mac's)
DEFAULT_RUNTIME = {
    "host": ETMETAL_RUNTIME,
    "mps": UPSTREAM_RUNTIME,
    "mps_emulated": UPSTREAM_RUNTIME,
}


def runtime_shims(target: str, runtime: str) -> frozenset[str]:
    """Every fallback symbol a ``.so`` for ``target`` may call when ``runtime`` runs it: the
    target's row of :data:`FALLBACKS`, plus the proxy executor on etmetal's runtime."""
    proxy = {PROXY_EXECUTOR_SHIM} if runtime == ETMETAL_RUNTIME else set()
    return fallback_shims(target) | proxy
