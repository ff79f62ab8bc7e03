"""torchao's low-bit Metal operators where torchao's MPS library cannot load.

Upstream's Metal flow quantizes linears with torchao's ``UIntxWeightOnlyConfig``, whose
module calls ``torchao::_pack_weight_<n>bit`` (at quantize time, on the CPU) and
``torchao::_linear_fp_act_<n>bit_weight`` (in forward). Both are defined by
``libtorchao_ops_mps_aten.dylib``, which exists only on macOS, so on Linux
``import torchao.experimental.ops.mps`` fails and the quantize -> export path cannot run.

:func:`register` defines those schemas (exactly torchao's) with CPU kernels that follow
torchao's packing format (:mod:`etmetal.common.lowbit`) when they are missing, then lets
torchao's own ``mps_op_lib`` register its meta kernels (the shapes export traces with).
Where the real library is loaded nothing is registered. ``import etmetal.backend`` calls
it (the package's ``__init__``), so a model quantized the upstream way after that import
exports unchanged, and so does every registry module.
"""

from __future__ import annotations

import importlib
import logging

import torch

from etmetal.common import lowbit

log = logging.getLogger(__name__)

_LIBRARY: torch.library.Library | None = None


def _have_ops() -> bool:
    try:
        for nbit in lowbit.NBITS:
            getattr(torch.ops.torchao, f"_linear_fp_act_{nbit}bit_weight")
            getattr(torch.ops.torchao, f"_pack_weight_{nbit}bit")
        return True
    except (AttributeError, RuntimeError):
        return False


def _pack_kernel(nbit: int):
    def pack_weight(w: torch.Tensor) -> torch.Tensor:
        return lowbit.pack(w.contiguous(), nbit)

    return pack_weight


def _linear_kernel(nbit: int):
    def linear(a, b, group_size, s, z):
        return lowbit.linear(lowbit.LinearOperands(a, b, group_size, s, z), nbit)

    return linear


def _linear_out_kernel(nbit: int):
    def linear_out(a, b, group_size, s, z, *, out):
        result = lowbit.linear(lowbit.LinearOperands(a, b, group_size, s, z), nbit)
        out.resize_(result.shape)
        return out.copy_(result)

    return linear_out


def _define(lib: torch.library.Library) -> None:
    for nbit in lowbit.NBITS:
        pack, linear = f"_pack_weight_{nbit}bit", f"_linear_fp_act_{nbit}bit_weight"
        args = "Tensor A, Tensor B, int group_size, Tensor S, Tensor Z"
        lib.define(f"{pack}(Tensor W) -> Tensor")
        lib.define(f"{linear}({args}) -> Tensor")
        lib.define(f"{linear}.out({args}, *, Tensor(a!) out) -> Tensor(a!)")
        lib.impl(pack, _pack_kernel(nbit), "CPU")
        lib.impl(linear, _linear_kernel(nbit), "CPU")
        lib.impl(f"{linear}.out", _linear_out_kernel(nbit), "CPU")


def _meta_linear(nbit: int):
    def linear(a, b, group_size, s, z):
        m, _, n = lowbit.check_linear_args(lowbit.LinearOperands(a, b, group_size, s, z), nbit)
        return a.new_empty((m, n))

    return linear


def register() -> bool:
    """Make torchao's low-bit Metal ops usable here; True if etmetal defined them."""
    global _LIBRARY
    if _LIBRARY is not None or _have_ops():
        return False
    lib = torch.library.Library("torchao", "FRAGMENT")
    _define(lib)
    _LIBRARY = lib
    try:  # torchao's own meta kernels, now that its ops exist
        importlib.import_module("torchao.experimental.ops.mps")
    except Exception as exc:  # torchao absent or changed: register equivalent ones
        log.debug("torchao.experimental.ops.mps did not load (%s); own meta kernels", exc)
        for nbit in lowbit.NBITS:
            lib.impl(f"_linear_fp_act_{nbit}bit_weight", _meta_linear(nbit), "Meta")
    log.debug("registered torchao low-bit op schemas with CPU reference kernels")
    return True
