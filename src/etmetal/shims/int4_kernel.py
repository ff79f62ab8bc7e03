"""The int4 linear shim's kernel: ``int4_linear.c``, computing group by group from the
packed weights (see that file), built once per content with ``-O3`` and called through
ctypes.

The reference (:func:`etmetal.common.lowbit.linear`) expands the whole weight matrix to
float32 on every call, which costs more than the matmul for one-row (decode-shaped)
inputs; this kernel reads each packed byte once and keeps only one group of dequantized
weights at a time. Activations, scales and zeros go over as float32 (each is at most
M x K or N x K/group_size, small beside the weights) and the result comes back in A's
dtype, as the reference returns it.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from etmetal.common import lowbit
from etmetal.common.native_build import WARNINGS, build_sources, load_checked

SOURCE = Path(__file__).with_name("int4_linear.c")
MAX_GROUP = max(lowbit.GROUP_SIZES)  # ETM_INT4_MAX_GROUP, checked at load


# up to this many activation rows the kernel's dot products are fastest (decode-shaped
# calls); above it a float32 matmul over dequantized tiles of TILE_BYTES wins
DOT_ROWS = 8
TILE_BYTES = 256 << 10


@functools.cache  # built and loaded once per process
def _kernels():
    path = build_sources(
        "kernels", "libetmetal_int4_linear.so", (SOURCE,), flags=("-O3", "-std=c11", *WARNINGS)
    )
    lib = load_checked(path, "etm_int4_max_group", MAX_GROUP, "largest lowbit group size")
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    dot = lib.etm_int4_linear_f32
    dot.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, p]
    dot.restype = ctypes.c_int
    tile = lib.etm_int4_dequantize_rows
    tile.argtypes = [p, p, p, i64, i64, i64, i64, i64, p]
    tile.restype = ctypes.c_int
    return dot, tile


def _rejected(m: int, k: int, n: int, group_size: int, scales: torch.Tensor) -> ValueError:
    return ValueError(
        f"_linear_fp_act_4bit_weight: the native kernel rejected M={m} K={k} N={n} "
        f"group_size={group_size} (scales {list(scales.shape)}) or could not allocate"
    )


def linear_4bit(
    a: torch.Tensor,
    packed: torch.Tensor,
    group_size: int,
    scales: torch.Tensor,
    zeros: torch.Tensor,
) -> torch.Tensor:
    """``A @ dequantize(B).T`` for 4-bit ``B`` (the numerics of ``lowbit.linear``), in A's
    dtype. Raises ValueError for arguments torchao's kernel rejects."""
    m, k, n = lowbit.check_linear_args(
        lowbit.LinearOperands(a, packed, group_size, scales, zeros), 4
    )
    dot, tile = _kernels()
    a32 = a.to(torch.float32).contiguous()
    # a non-contiguous packed view is copied packed: still half a byte a weight
    packed = packed.contiguous()
    groups = -(-k // group_size)  # the reference reads only these columns of S and Z
    s32 = scales[:, :groups].to(torch.float32).contiguous()
    z32 = zeros[:, :groups].to(torch.float32).contiguous()
    out = torch.empty((m, n), dtype=torch.float32)
    ptrs = (packed.data_ptr(), s32.data_ptr(), z32.data_ptr())
    if m <= DOT_ROWS:
        if dot(a32.data_ptr(), *ptrs, m, k, n, group_size, groups, out.data_ptr()) != 0:
            raise _rejected(m, k, n, group_size, scales)
        return out.to(a.dtype)
    rows = max(1, min(n, TILE_BYTES // max(4 * k, 1)))
    w = torch.empty((rows, k), dtype=torch.float32)
    for row0 in range(0, n, rows):
        count = min(rows, n - row0)
        if tile(*ptrs, row0, count, k, group_size, groups, w.data_ptr()) != 0:
            raise _rejected(m, k, n, group_size, scales)
        out[:, row0 : row0 + count] = torch.mm(a32, w[:count].t())
    return out.to(a.dtype)
