"""torchao's low-bit weight format for Metal (``UIntxWeightOnlyConfig``), in plain torch.

torchao's MPS library packs an ``[N, K]`` matrix of unsigned ``nbit`` values along K: each
row is a little-endian bit stream, value ``k`` in bits ``[k*nbit, (k+1)*nbit)``, so a row
takes ``K * nbit / 8`` bytes (4 bits: the even column in the low nibble, the odd one in the
high nibble). A weight is ``q * scale + zero`` with one scale and one zero per group of
``group_size`` columns (torchao stores ``zero = -zero_point * scale``), and the linear is
``A @ W.T`` on the dequantized matrix, which is exactly torchao's own reference.

Both sides need this: the ahead-of-time side registers torchao's op schemas with these
CPU kernels where torchao's MPS library cannot load, and the runtime's fallback shim runs
the same numerics on the packed weights the program stores.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GROUP_SIZES = (32, 64, 128, 256)
NBITS = range(1, 8)


def packed_row_bytes(k: int, nbit: int) -> int:
    return k * nbit // 8


def pack(values: torch.Tensor, nbit: int) -> torch.Tensor:
    """``[N, K]`` uint8 values below ``2**nbit`` -> ``[N, K*nbit/8]`` packed uint8."""
    if values.dim() != 2 or values.dtype != torch.uint8:
        raise ValueError(
            f"pack: expected a 2-d uint8 tensor, got {values.dtype} {list(values.shape)}"
        )
    n, k = values.shape
    if k % 8:
        raise ValueError(f"pack: K={k} must be a multiple of 8")
    if values.numel() and int(values.max()) >> nbit:
        raise ValueError(f"pack: values must be below 2**{nbit}")
    if nbit == 4:  # the common case, without the bit expansion: even column low nibble
        return values[:, 0::2] | (values[:, 1::2] << 4)
    shifts = torch.arange(nbit, dtype=torch.uint8)
    bits = (values.unsqueeze(-1) >> shifts) & 1  # [N, K, nbit], least significant first
    bits = bits.reshape(n, packed_row_bytes(k, nbit), 8).to(torch.int32)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.int32)
    return (bits * weights).sum(-1).to(torch.uint8)


def unpack(packed: torch.Tensor, k: int, nbit: int) -> torch.Tensor:
    """``[N, K*nbit/8]`` packed uint8 -> ``[N, K]`` uint8 values (inverse of :func:`pack`)."""
    n = packed.shape[0]
    if nbit == 4:
        return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(n, k)
    shifts = torch.arange(8, dtype=torch.uint8)
    bits = (packed.unsqueeze(-1) >> shifts) & 1  # [N, bytes, 8]
    bits = bits.reshape(n, k, nbit).to(torch.int32)
    weights = torch.tensor([1 << i for i in range(nbit)], dtype=torch.int32)
    return (bits * weights).sum(-1).to(torch.uint8)


class LinearOperands(NamedTuple):
    """The operands of torchao's ``_linear_fp_act_{nbit}bit_weight(A, B, group_size, S, Z)``:
    activations, packed weights, columns per group, scales and zeros."""

    a: torch.Tensor
    packed: torch.Tensor
    group_size: int
    scales: torch.Tensor
    zeros: torch.Tensor


def check_linear_args(operands: LinearOperands, nbit: int) -> tuple[int, int, int]:
    """The conditions torchao's kernel checks; returns ``(M, K, N)``. Raises ValueError."""
    a, packed, group_size, scales, zeros = operands
    op = f"_linear_fp_act_{nbit}bit_weight"
    if a.dtype not in (torch.float32, torch.float16, torch.bfloat16) or a.dim() != 2:
        raise ValueError(f"{op}: A must be a 2-d float tensor, got {a.dtype} {list(a.shape)}")
    m, k = a.shape
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"{op}: B must be 2-d uint8 packed weights, got {packed.dtype}")
    n = packed.shape[0]
    if k % 8 or packed.shape[1] != packed_row_bytes(k, nbit):
        raise ValueError(
            f"{op}: B has {packed.shape[1]} bytes per row, K={k} needs {packed_row_bytes(k, nbit)}"
            " (K a multiple of 8)"
        )
    if group_size not in GROUP_SIZES:
        raise ValueError(f"{op}: group_size must be one of {GROUP_SIZES}, got {group_size}")
    if n % 4 and m != 1:  # torchao's kernels tile N by 4 unless there is one row
        raise ValueError(f"{op}: N={n} must be a multiple of 4 when M={m} is not 1")
    groups = -(-k // group_size)
    for name, t in (("S", scales), ("Z", zeros)):
        if t.dim() != 2 or t.shape[0] != n or t.shape[1] < groups:
            raise ValueError(
                f"{op}: {name} must be [{n}, {groups}] (one per output row and group), got "
                f"{list(t.shape)}"
            )
        if t.dtype != a.dtype:
            raise ValueError(f"{op}: {name} has dtype {t.dtype}, A has {a.dtype}")
    return m, k, n


def dequantize(
    packed: torch.Tensor,
    k: int,
    group_size: int,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    nbit: int,
) -> torch.Tensor:
    """The ``[N, K]`` float32 weight: ``q * scale + zero`` per group of columns."""
    q = unpack(packed, k, nbit).to(torch.float32)
    n, groups = q.shape[0], -(-k // group_size)
    s = scales[:, :groups].to(torch.float32)
    z = zeros[:, :groups].to(torch.float32)
    if k % group_size == 0:  # one broadcast per group, no expanded scale matrices
        w = q.view(n, groups, group_size) * s.unsqueeze(-1) + z.unsqueeze(-1)
        return w.view(n, k)
    s = s.repeat_interleave(group_size, dim=1)[:, :k]  # a partial last group
    z = z.repeat_interleave(group_size, dim=1)[:, :k]
    return q * s + z


def linear(operands: LinearOperands, nbit: int) -> torch.Tensor:
    """``A @ dequantize(B).T`` in float32, returned in A's dtype (torchao's reference)."""
    _, k, _ = check_linear_args(operands, nbit)
    a, packed, group_size, scales, zeros = operands
    w = dequantize(packed, k, group_size, scales, zeros, nbit)
    return torch.mm(a.to(torch.float32), w.t()).to(a.dtype)
