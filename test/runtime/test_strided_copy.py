"""The native strided copy and the ``view_copy`` kernel that uses it, against torch."""

from __future__ import annotations

import pytest
import torch
from random_tensors import make_tensor

from etmetal.runtime.kernels import lookup
from etmetal.runtime.kernels.strided_copy import available, strided_copy

view_copy = lookup("aten::view_copy.out")

DTYPES = [torch.float32, torch.float64, torch.int8, torch.float16, torch.int64, torch.bool]


def _sources(dtype):
    """(name, tensor) pairs: channels-last 3-D..5-D, permuted, sliced, odd sizes."""
    yield "cl_4d", make_tensor((2, 37, 9, 11), dtype).to(memory_format=torch.channels_last)
    yield "cl_4d_big", make_tensor((1, 64, 40, 33), dtype).to(memory_format=torch.channels_last)
    yield "cl_5d", make_tensor((2, 5, 3, 7, 6), dtype).to(memory_format=torch.channels_last_3d)
    yield "cl_3d", make_tensor((3, 50, 45), dtype).permute(0, 2, 1).contiguous().permute(0, 2, 1)
    yield "permuted_4d", make_tensor((5, 6, 7, 8), dtype).permute(3, 1, 0, 2)
    yield "transposed_2d", make_tensor((70, 130), dtype).t()
    yield "sliced", make_tensor((6, 40, 50), dtype)[1:5, 3:37:2, ::3]
    yield "sliced_permuted", make_tensor((6, 40, 50), dtype)[:, 5:, 7:].permute(2, 0, 1)
    yield "negative_stride", make_tensor((33, 34), dtype).flip(0).t()
    yield "expanded", make_tensor((1, 5, 1), dtype).expand(4, 5, 6)
    yield "size_one", make_tensor((1, 1, 1), dtype)
    yield "empty", make_tensor((3, 0, 4), dtype)


CASES = [(d, name) for d in DTYPES for name, _ in _sources(torch.float32)]


def test_kernel_builds_here():
    assert available()


@pytest.mark.parametrize("dtype,name", CASES, ids=[f"{d}-{n}" for d, n in CASES])
def test_strided_copy_into_contiguous_and_back(dtype, name):
    src = dict(_sources(dtype))[name]
    dst = torch.zeros_like(src, memory_format=torch.contiguous_format)
    assert strided_copy(dst, src)
    assert torch.equal(dst, src)
    # scatter the other way: contiguous source into the strided layout of a fresh buffer
    back = torch.empty_strided(src.shape, src.stride(), dtype=dtype) if _writable(src) else None
    if back is not None:
        assert strided_copy(back, dst)
        assert torch.equal(back, src)


def _writable(t: torch.Tensor) -> bool:
    """A layout ``empty_strided`` can make and a copy can write: no negative stride, no two
    elements at one address (torch's own overlap check)."""
    return all(st >= 0 for st in t.stride()) and torch._debug_has_internal_overlap(t) == 0


def test_overlapping_and_unsupported_fall_back():
    buf = torch.arange(64, dtype=torch.float32)
    a, b = buf[:48].view(6, 8), buf[16:].view(6, 8)
    assert not strided_copy(a, b)  # overlapping memory: refused, nothing written
    assert torch.equal(buf, torch.arange(64, dtype=torch.float32))
    c = torch.randn(3, 4, dtype=torch.complex64)
    assert not strided_copy(torch.empty(4, 3, dtype=torch.complex64), c.conj().t())
    assert not strided_copy(torch.empty(3, 4), torch.randn(4, 3))  # shape mismatch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize(
    "shape,fmt,size",
    [
        ((2, 32, 24, 20), torch.channels_last, [2, -1]),
        ((1, 48, 17, 13), torch.channels_last, [1, 48 * 17 * 13]),
        ((2, 8, 5, 6, 7), torch.channels_last_3d, [16, 210]),
    ],
)
def test_view_copy_channels_last_matches_reshape(dtype, shape, fmt, size):
    x = make_tensor(shape, dtype).to(memory_format=fmt)
    want = x.reshape([s if s != -1 else x.numel() // shape[0] for s in size])
    out = torch.empty(want.shape, dtype=dtype)
    view_copy(x, size, out)
    assert torch.equal(out, want)


def test_view_copy_into_channels_last_out_matches_reshape():
    x = torch.randn(2, 32 * 6 * 5)
    out = torch.empty(2, 32, 6, 5).to(memory_format=torch.channels_last)
    view_copy(x, [2, 32, 6, 5], out)
    assert out.stride() == torch.empty(2, 32, 6, 5).to(memory_format=torch.channels_last).stride()
    assert torch.equal(out, x.reshape(2, 32, 6, 5))
