"""A native strided copy: ``dst[i] = src[i]`` for two same-shape tensors of any strides.

torch's ``copy_`` between layouts whose fastest dims differ (channels-last to
contiguous, a permuted view) walks one side element by element; this kernel merges
dims that are contiguous on both sides, then moves the two dims that are fastest on
each side into a tiled (cache-blocked) transpose, so both reads and writes stream
(vector tiles in ``native/transpose_kernels.c``, non-temporal stores of whole cache
lines for large copies in ``native/transpose_stream.c``; rows they leave take scalar
tiles). The C sources are built with ``-O3`` and all warnings as errors once per content
(``common.native_build``) and called through ctypes;
the geometry goes over as packed int64s. Elements of 1, 2, 4 or 8 bytes; anything else
(or overlap, non-CPU, too many dims) returns False and the caller falls back to torch.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from pathlib import Path

import torch

from etmetal.common.native_build import WARNINGS, NativeBuildError, build_sources, load_checked

MAX_DIMS = 16  # MAXD of native/strided_copy.c; checked against it at load

NATIVE_DIR = Path(__file__).parent / "native"
SOURCES = (
    NATIVE_DIR / "strided_copy.c",
    NATIVE_DIR / "transpose_kernels.c",
    NATIVE_DIR / "transpose_stream.c",
)
HEADERS = (NATIVE_DIR / "transpose_kernels.h", NATIVE_DIR / "transpose_micro.h")

# geometry goes to C as packed int64s: struct.pack is several times cheaper than a ctypes array
_GEOM = tuple(struct.Struct(f"={max(n, 1)}q") for n in range(3 * MAX_DIMS + 1))


@functools.cache  # loaded once per process (a failed build is retried on the next call)
def _function():
    path = build_sources(
        "kernels",
        "libetmetal_strided_copy.so",
        SOURCES,
        HEADERS,
        flags=("-O3", "-std=c11", *WARNINGS),
    )
    lib = load_checked(path, "etm_strided_copy_max_dims", MAX_DIMS, "strided_copy.MAX_DIMS")
    p = ctypes.c_void_p
    fns = []
    for name in ("etm_strided_copy", "etm_gather_contiguous"):
        fn = getattr(lib, name)
        fn.argtypes = [p, p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64]
        fn.restype = ctypes.c_int
        fns.append(fn)
    lib.etm_stream_threshold.restype = ctypes.c_int64
    lib.etm_set_stream_threshold.argtypes = [ctypes.c_int64]
    lib.etm_set_stream_threshold.restype = None
    lib.etm_stream_min_rows_bytes.restype = ctypes.c_int64
    return (lib, *fns)


def available() -> bool:
    """Whether the native kernel builds and loads here (else callers use torch)."""
    try:
        _function()
    except (NativeBuildError, OSError):
        return False
    return True


def stream_threshold_bytes() -> int:
    """Transposes of at least this many bytes may use non-temporal stores (a quarter of
    L3; see ``stream_min_rows_bytes``)."""
    return int(_function()[0].etm_stream_threshold())


def stream_min_rows_bytes() -> int:
    """A transpose past the threshold streams only when its rows (the source's fastest dim)
    span at least this many bytes per column; with fewer it keeps cached stores."""
    return int(_function()[0].etm_stream_min_rows_bytes())


def set_stream_threshold_bytes(nbytes: int) -> int:
    """Use non-temporal stores from ``nbytes`` on (tests); returns the previous threshold."""
    previous = stream_threshold_bytes()
    _function()[0].etm_set_stream_threshold(nbytes)
    return previous


def _applies(src: torch.Tensor) -> bool:
    # lazily negated/conjugated views: torch resolves those bits in its own copy
    return (
        src.is_cpu
        and src.dim() <= MAX_DIMS
        and not src.is_neg()
        and not (src.dtype.is_complex and src.is_conj())
    )


def _kernels_for(dst: torch.Tensor, src: torch.Tensor):
    """The native kernels when they can copy ``src`` into ``dst`` (same dtype, host, no lazy
    negation or conjugation), else None."""
    if (
        dst.dtype != src.dtype
        or not dst.is_cpu
        or dst.is_neg()
        or (dst.dtype.is_complex and dst.is_conj())
        or not _applies(src)
    ):
        return None
    try:
        return _function()
    except (NativeBuildError, OSError):
        return None


def strided_copy(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Copy ``src`` into ``dst`` (same shape and dtype, any strides) natively.

    Returns False, having done nothing, when the kernel does not apply: the caller
    then uses ``dst.copy_(src)``.
    """
    if dst.shape != src.shape:
        return False
    lib = _kernels_for(dst, src)
    if lib is None:
        return False
    nd = dst.dim()
    geom = _GEOM[3 * nd].pack(*dst.shape, *src.stride(), *dst.stride())
    return lib[1](dst.data_ptr(), src.data_ptr(), nd, geom, dst.element_size()) == 0


def gather_contiguous(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Copy ``src`` (any strides) in its logical row-major order into contiguous ``dst``.

    ``dst`` may have any shape with as many elements (a reshape target): this saves
    making a view of it. Returns False, having done nothing, when the kernel does not
    apply (``dst`` not contiguous, dtype or element count differ, ...).
    """
    if dst.numel() != src.numel() or not dst.is_contiguous():
        return False
    lib = _kernels_for(dst, src)
    if lib is None:
        return False
    nd = src.dim()
    geom = _GEOM[2 * nd].pack(*src.shape, *src.stride())  # C derives dst strides
    return lib[2](dst.data_ptr(), src.data_ptr(), nd, geom, src.element_size()) == 0
