"""torchao's low-bit packing, as its MPS kernels read it, and its reference linear."""

from __future__ import annotations

import pytest
import torch

from etmetal.common import lowbit


def _values(n: int, k: int, nbit: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << nbit, (n, k), dtype=torch.uint8, generator=gen)


def test_4bit_packs_the_even_column_in_the_low_nibble():
    v = _values(3, 16, 4)
    packed = lowbit.pack(v, 4)
    assert packed.shape == (3, 8) and packed.dtype == torch.uint8
    for n in range(3):
        for j in range(8):
            assert int(packed[n, j]) == int(v[n, 2 * j]) | (int(v[n, 2 * j + 1]) << 4)


def test_3bit_packs_eight_values_into_three_bytes():
    # torchao's packing.h: b0 = v0 | v1<<3 | v2<<6; b1 = v2>>2 | v3<<1 | v4<<4 | v5<<7; ...
    v = [int(x) for x in _values(1, 8, 3)[0]]
    b = [int(x) for x in lowbit.pack(torch.tensor([v], dtype=torch.uint8), 3)[0]]
    assert b[0] == (v[0] | v[1] << 3 | v[2] << 6) & 0xFF
    assert b[1] == (v[2] >> 2 | v[3] << 1 | v[4] << 4 | v[5] << 7) & 0xFF
    assert b[2] == (v[5] >> 1 | v[6] << 2 | v[7] << 5) & 0xFF


@pytest.mark.parametrize("nbit", list(lowbit.NBITS))
def test_unpack_inverts_pack(nbit):
    v = _values(5, 64, nbit, seed=nbit)
    packed = lowbit.pack(v, nbit)
    assert packed.shape == (5, 64 * nbit // 8)
    assert torch.equal(lowbit.unpack(packed, 64, nbit), v)


def test_linear_is_dequantize_by_group_then_matmul():
    n, k, gs = 8, 64, 32
    q = _values(n, k, 4)
    scales = torch.rand(n, k // gs) + 0.01
    zeros = -torch.randint(0, 16, (n, k // gs)).float() * scales
    a = torch.randn(3, k)
    # torchao's test reference, written out: each weight is q * scale + zero of its group
    w = torch.empty(n, k)
    for i in range(n):
        for j in range(k):
            w[i, j] = q[i, j] * scales[i, j // gs] + zeros[i, j // gs]
    got = lowbit.linear(lowbit.LinearOperands(a, lowbit.pack(q, 4), gs, scales, zeros), 4)
    torch.testing.assert_close(got, a @ w.t(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "change, mentions",
    [
        ({"group_size": 48}, "group_size"),
        ({"packed": torch.zeros(8, 31, dtype=torch.uint8)}, "bytes per row"),
        ({"scales": torch.ones(7, 2)}, "S must be"),
        ({"zeros": torch.zeros(8, 2, dtype=torch.float64)}, "Z has dtype"),
        ({"a": torch.ones(3, 64, dtype=torch.int32)}, "A must be"),
        ({"packed": torch.zeros(6, 32, dtype=torch.uint8)}, "multiple of 4"),
    ],
)
def test_bad_arguments_name_what_is_wrong(change, mentions):
    args = {
        "a": torch.randn(3, 64),
        "packed": torch.zeros(8, 32, dtype=torch.uint8),
        "group_size": 32,
        "scales": torch.ones(8, 2),
        "zeros": torch.zeros(8, 2),
    }
    args.update(change)
    with pytest.raises(ValueError, match=mentions):
        lowbit.linear(lowbit.LinearOperands(**args), 4)


def test_a_partial_last_group_uses_its_own_scale():
    # K=40 with groups of 32: the last 8 columns form a group of their own
    n, k, gs = 4, 40, 32
    q = _values(n, k, 4, seed=3)
    scales, zeros = torch.rand(n, 2) + 0.1, torch.rand(n, 2)
    w = lowbit.dequantize(lowbit.pack(q, 4), k, gs, scales, zeros, 4)
    torch.testing.assert_close(w[:, :32], q[:, :32].float() * scales[:, :1] + zeros[:, :1])
    torch.testing.assert_close(w[:, 32:], q[:, 32:].float() * scales[:, 1:] + zeros[:, 1:])
