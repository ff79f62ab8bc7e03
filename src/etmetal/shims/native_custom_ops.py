"""The custom operators' shims served in C: torchao's int4 linear, ``metal::gather_qmv`` and
``metal::gated_delta_rule``, on the host (``aoti_torch_cpu_*``) and on the emulated Metal
device (``aoti_torch_mps_*``).

The Python shims (``custom_op_shims``) stay the reference, and the C is bit for bit theirs
(``native_custom_ops.cpp``, its own unit of the bridge): the int4 linear runs the kernels
the Python shim runs (``int4_linear.c``, and libtorch's mm over dequantized tiles for many
rows); the two Metal operators replay ExecuTorch's Python references op by op, with
libtorch's own matrix-vector product (``aoti_torch_cpu_addmv``, what ``Tensor.mv`` runs)
and ATen's cascade sum for the sums over the last dimension. That sum's order depends on
the vector width of the kernel ATen dispatches to on this CPU, which :func:`configure`
finds by comparing the replay with ``torch.sum`` itself; where no width matches,
``gated_delta_rule`` stays Python's.

Only float32 operands are served, in the layouts the references' kernels would see;
anything else, and every argument a shim would refuse, reaches the Python shim, which
computes it or names what is wrong.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from etmetal.common.targets import CPU_DEVICE, METAL_DEVICE

from . import int4_kernel
from .device import BridgeSource

SOURCE = Path(__file__).with_name("native_custom_ops.cpp")
# the libtorch table this unit adds (native_fallbacks.bind fills it when present)
LIBTORCH_TABLE = ("etm_lt_cop_table", "etm_lt_cop_count")

# the lane counts a Vectorized<float> can have (128- to 1024-bit vectors)
_LANES = (4, 8, 16, 32)


def _served(call: str) -> str:
    # ETM_HIT_NATIVE() is defined per forwarder by the bridge generator (per-shim counts)
    return f"  if ({call}) {{ ETM_HIT_NATIVE(); return 0; }}\n"


def _paths(prefix: str, device: str) -> dict[str, str]:
    return {
        f"aoti_torch_{prefix}__linear_fp_act_4bit_weight": _served(
            f"etm_cop_int4_linear({device}, a0, a1, a2, a3, a4, a5)"
        ),
        f"aoti_torch_{prefix}_gather_qmv": _served(
            f"etm_cop_gather_qmv({device}, a0, a1, a2, a3, a4, a5, a6)"
        ),
        f"aoti_torch_{prefix}_gated_delta_rule": _served(
            f"etm_cop_gated_delta_rule({device}, a0, a1, a2, a3, a4, a5, a6)"
        ),
    }


# forwarded shim -> the C served before Python (bridge._native_path)
NATIVE_PATHS = {**_paths(CPU_DEVICE, "0"), **_paths(METAL_DEVICE, "ETM_DEVICE_MPS")}
# what a context's trampoline adds for this unit (ShimContext.load_bridge; bridge.build
# compiles the unit). Not a standard path of every trampoline: the stock runtime's serves
# these shims its own way and does not link this unit
BRIDGE_SOURCE = BridgeSource(native_paths=NATIVE_PATHS)


def sum_lanes(lib: ctypes.CDLL) -> int:
    """The float32 lanes ATen's sum kernel runs with in this process (0: none matches):
    the lane count whose replay (``etm_cop_row_sum``) gives torch.sum's bits on rows of
    several lengths. It is the dispatched kernel's, which is not always the CPU's widest
    (an AVX512 machine may sum with AVX2's kernel)."""
    row_sum = lib.etm_cop_row_sum
    row_sum.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    row_sum.restype = ctypes.c_float
    gen = torch.Generator().manual_seed(0)
    rows = [
        torch.randn(n, generator=gen) * 1000 for n in (32, 75, 200, 1000, 4099) for _ in range(4)
    ]
    want = [torch.sum(r).view(1).view(torch.int32).item() for r in rows]
    for lanes in _LANES:
        got = [
            torch.tensor([row_sum(r.data_ptr(), r.numel(), lanes)]).view(torch.int32).item()
            for r in rows
        ]
        if got == want:
            return lanes
    return 0


def configure(lib: ctypes.CDLL) -> None:
    """Tell a loaded bridge with this unit what only Python knows: where the int4 linear
    switches from dot products to tiles, and the sum kernel's vector width."""
    if not hasattr(lib, LIBTORCH_TABLE[1]):
        return  # a bridge built without this unit (the stock runtime's)
    ctypes.c_int64.in_dll(lib, "etm_int4_dot_rows").value = int4_kernel.DOT_ROWS
    ctypes.c_int64.in_dll(lib, "etm_int4_tile_bytes").value = int4_kernel.TILE_BYTES
    ctypes.c_int64.in_dll(lib, "etm_sum_lanes").value = sum_lanes(lib)
