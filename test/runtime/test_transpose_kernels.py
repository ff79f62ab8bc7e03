"""The vector transpose tiles of the native strided copy, path by path, against torch's copy.

Shapes are picked to land on each code path: element sizes 1, 2, 4 and 8; row counts
(the source's fast dim) with tails after the 16/8/4-row tiles; column counts with tails
after the micro-tiles and the cache blocks; destination strides that crowd L1 sets (8-row
tiles) or not (16-row tiles); and copies past the streaming-store threshold, whose
staging buffer streams whole cache lines and writes the partial lines at row ends with
ordinary stores (destination rows at any alignment, row counts off every block size,
chunks of columns cut mid-line, padding between rows that must stay untouched).
"""

from __future__ import annotations

import pytest
import torch
from random_tensors import make_tensor

from etmetal.runtime.kernels import lookup
from etmetal.runtime.kernels.strided_copy import (
    gather_contiguous,
    set_stream_threshold_bytes,
    stream_min_rows_bytes,
    stream_threshold_bytes,
    strided_copy,
)

view_copy = lookup("aten::view_copy.out")

DTYPES = [
    torch.float32,
    torch.int32,
    torch.float64,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a contiguous tensor, so NaN payloads compare exactly."""
    return t.contiguous().view(torch.uint8)


# (rows = source-fast dim, cols = destination-fast dim): tails after 16-, 8- and 4-row
# tiles (37 = 32 + 4 + 1, 13 = 8 + 4 + 1), columns past one micro-tile and past a cache
# block (257, 1031, 4100), and too small for any tile (3 x 5)
MATRICES = [(8, 16), (16, 17), (13, 257), (37, 1031), (48, 300), (5, 4100), (3, 5), (64, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,cols", MATRICES, ids=[f"{r}x{c}" for r, c in MATRICES])
def test_2d_transpose_both_directions(dtype, rows, cols):
    src = make_tensor((cols, rows), dtype).t()  # logical [rows, cols], rows fastest in memory
    dst = torch.empty(rows, cols, dtype=dtype)
    assert strided_copy(dst, src)
    assert torch.equal(_bits(dst), _bits(src.contiguous()))
    back = torch.empty(cols, rows, dtype=dtype).t()  # scatter into the transposed layout
    assert strided_copy(back, dst)
    assert torch.equal(_bits(back.t()), _bits(src.t()))


PERMUTATIONS = [
    ((3, 40, 33), (0, 2, 1)),
    ((20, 3, 41), (2, 0, 1)),
    ((2, 19, 24, 33), (0, 2, 3, 1)),  # NCHW values held channels-last
    ((2, 24, 33, 19), (0, 3, 1, 2)),
    ((5, 6, 17, 18), (3, 1, 0, 2)),
    ((4, 3, 9, 10, 11), (0, 2, 4, 1, 3)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,perm", PERMUTATIONS, ids=[str(p) for _, p in PERMUTATIONS])
def test_permuted_views_gather_in_logical_order(dtype, shape, perm):
    src = make_tensor(shape, dtype).permute(perm)
    dst = torch.empty(src.shape, dtype=dtype)
    assert strided_copy(dst, src)
    assert torch.equal(_bits(dst), _bits(src.contiguous()))
    flat = torch.empty(src.numel(), dtype=dtype)
    assert gather_contiguous(flat, src)
    assert torch.equal(_bits(flat), _bits(src.reshape(-1)))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.int8, torch.float64], ids=str
)
@pytest.mark.parametrize("hw", [4096, 1024, 1000, 1023], ids=["4k", "1k", "spread", "odd"])
@pytest.mark.parametrize("channels", [32, 40, 19])
def test_channels_last_plane_strides(dtype, hw, channels):
    """Plane strides near a multiple of 4 KiB (8-row tiles), spread (16-row), odd (unaligned)."""
    x = make_tensor((1, hw, channels), dtype).permute(0, 2, 1)  # [1, C, HW] channels-last
    out = torch.empty(1, channels * hw, dtype=dtype)
    view_copy(x, [1, channels * hw], out)
    assert torch.equal(_bits(out), _bits(x.reshape(1, -1)))


def test_nan_payloads_and_signed_zeros_survive():
    raw = torch.arange(40 * 24, dtype=torch.int32).mul_(2654435761 % 2**31).view(40, 24)
    raw[::3] |= 0x7F800001  # NaNs with distinct payloads
    raw[1::7] = -(2**31)  # -0.0
    src = raw.view(torch.float32).t()
    dst = torch.empty(src.shape)
    assert strided_copy(dst, src)
    assert torch.equal(dst.view(torch.int32), raw.t().contiguous())


@pytest.fixture
def big_elems():
    """The streaming threshold, moved to 1 MiB: the same path as a quarter of L3 (8 MiB
    here) at any cache size, with test tensors that stay small."""
    previous = set_stream_threshold_bytes(1 << 20)
    yield stream_threshold_bytes()
    set_stream_threshold_bytes(previous)


def _streamed_rows(item: int) -> int:
    """The fewest rows (channels) whose transpose streams past the threshold."""
    return -(-stream_min_rows_bytes() // item)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.uint8], ids=str
)
@pytest.mark.parametrize("aligned", [True, False], ids=["rows_aligned", "rows_unaligned"])
@pytest.mark.parametrize("extra", [0, 5], ids=["min_channels", "more_channels"])
def test_copies_past_the_streaming_threshold(dtype, aligned, extra, big_elems):
    item = torch.empty((), dtype=dtype).element_size()
    channels = _streamed_rows(item) + extra
    hw = big_elems // item // channels + 64
    hw = hw - hw % 64 if aligned else hw | 1  # 64-byte aligned destination rows, or not
    x = make_tensor((1, hw, channels), dtype).permute(0, 2, 1)
    assert x.numel() * item >= big_elems
    out = torch.empty(1, channels * hw, dtype=dtype)
    assert gather_contiguous(out, x)
    assert torch.equal(_bits(out), _bits(x.reshape(1, -1)))


@pytest.fixture
def stream_all():
    """Streaming threshold 0: every transpose with enough rows streams, however small."""
    previous = set_stream_threshold_bytes(0)
    yield
    set_stream_threshold_bytes(previous)


# (extra rows over the streaming minimum, columns, destination offset in elements, padding
# elements after each destination row, padding elements after each source column). Rows
# past the minimum land off the micro-tile and block sizes (+1, +3, +9, +33, +67, +131,
# +200; blocks are 64 rows); columns
# are odd, shorter than a line for 1-byte elements (17, 61), or cut into several chunks
# mid-line (515, 1031, 2053); offsets and row lengths put row starts at every alignment,
# so rows begin and end with partial lines
STAGED = [
    (0, 16, 0, 0, 0),
    (1, 17, 1, 0, 0),
    (3, 61, 0, 3, 2),
    (0, 100, 3, 0, 0),
    (67, 129, 0, 0, 1),
    (131, 77, 5, 1, 0),
    (1, 515, 7, 0, 3),
    (9, 1031, 1, 9, 0),
    (33, 2053, 0, 0, 0),
    (200, 300, 2, 0, 7),
]
ELEMENT_SIZES = [torch.uint8, torch.bool, torch.float16, torch.int16, torch.float32, torch.int64]


@pytest.mark.parametrize("dtype", [*ELEMENT_SIZES, torch.float64], ids=str)
@pytest.mark.parametrize(
    "extra,cols,offset,dpad,spad", STAGED, ids=["-".join(map(str, c)) for c in STAGED]
)
def test_streamed_transpose_writes_exactly_its_rows(
    dtype, extra, cols, offset, dpad, spad, stream_all
):
    item = torch.empty((), dtype=dtype).element_size()
    rows = _streamed_rows(item) + extra
    # source: rows fastest (a [cols, rows + spad] buffer, the padding never read)
    src = make_tensor((cols, rows + spad), dtype)[:, :rows].t()
    # destination rows of `cols` elements, `dpad` after each, `offset` into a sentinel buffer
    n = offset + rows * (cols + dpad) + 64 // item  # a line of slack at the end
    whole = torch.full((n * item,), 0xA5, dtype=torch.uint8).view(dtype)
    dst = whole[offset : offset + rows * (cols + dpad)].view(rows, cols + dpad)[:, :cols]
    assert strided_copy(dst, src)
    assert torch.equal(_bits(dst), _bits(src.contiguous()))
    # every byte outside the rows keeps the sentinel: nothing written past a row's end
    written = torch.zeros(whole.numel(), dtype=torch.bool)
    written[offset : offset + rows * (cols + dpad)].view(rows, cols + dpad)[:, :cols] = True
    untouched = whole.view(torch.uint8).view(-1, item)[~written]
    assert torch.equal(untouched, torch.full_like(untouched, 0xA5))


def test_gather_contiguous_refuses_what_it_cannot_do():
    x = make_tensor((2, 8, 5, 6), torch.float32).to(memory_format=torch.channels_last)
    assert not gather_contiguous(torch.empty(2, 239), x)  # element count differs
    assert not gather_contiguous(torch.empty(2, 240, dtype=torch.float64), x)  # dtype
    assert not gather_contiguous(torch.empty(240, 2).t(), x)  # out not contiguous
    negated = torch.randn(2, 8, 5, 6, dtype=torch.complex64).conj().imag
    assert negated.is_neg()  # a lazily negated view: torch's copy resolves the bit
    assert not gather_contiguous(torch.empty(2, 240), negated)
    out = torch.full((2, 240), 7.0)
    assert not gather_contiguous(out, out.t())  # overlapping: refused, nothing written
    assert torch.equal(out, torch.full((2, 240), 7.0))


@pytest.mark.parametrize("size", [[2, 240], [2, -1], [-1, 120], [480]])
def test_view_copy_fast_and_inferred_sizes_agree(size):
    x = make_tensor((2, 8, 5, 6), torch.float32).to(memory_format=torch.channels_last)
    want = x.reshape(size)
    out = torch.empty(want.shape)
    view_copy(x, size, out)
    assert torch.equal(out, want)
