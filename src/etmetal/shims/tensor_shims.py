"""Tensor lifetime, views, copies and getters: the ``aoti_torch_*`` shims every wrapper calls.

Every shim takes its ``ShimContext`` first (``registry``): handles and allocators are the
context's; the materialize policy is the running model's (``ShimContext.running``), or the
context's for calls made outside a model's run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from etmetal.shims.abi_codes import (
    DEVICE_CPU,
    DTYPE_CODES,
    DTYPE_TO_TORCH,
    ITEMSIZE,
    LAYOUT_STRIDED,
)

from .registry import ShimTable, check_ndim, read_i64s
from .storage import (
    ShimError,
    Storage,
    Tensor,
    contiguous_strides,
    is_packed,
    packed_extent,
)

if TYPE_CHECKING:
    from .context import ShimContext

# this module's shims: registered on a context by whoever builds it, never on import
SHIMS = ShimTable()
shim = SHIMS.shim

DTYPE_FLOAT32 = DTYPE_CODES["float32"]


def check_dtype(dtype: int) -> int:
    if dtype not in ITEMSIZE:
        raise ShimError(f"unsupported dtype code {dtype}")
    return dtype


def _check_geometry(sizes: tuple[int, ...], strides: tuple[int, ...]) -> None:
    if (not sizes or min(sizes) >= 0) and (not strides or min(strides) >= 0):
        return
    for d, (s, st) in enumerate(zip(sizes, strides)):
        if s < 0:
            raise ShimError(f"size {s} at dim {d} is negative")
        if st < 0:
            raise ShimError(f"stride {st} at dim {d} is negative")


def _check_fits(storage: Storage, dtype: int, sizes, strides, offset: int) -> None:
    if offset < 0:
        raise ShimError(f"storage offset {offset} is negative")
    extent = packed_extent(sizes, strides)
    end = (offset + extent) * ITEMSIZE[dtype] if extent else 0
    if end > storage.nbytes:
        raise ShimError(
            f"view (sizes={list(sizes)}, strides={list(strides)}, offset={offset}) reaches byte "
            f"{end} but its storage has {storage.nbytes} bytes"
        )


def new_owned(
    ctx: ShimContext,
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: int,
    device_type: int = DEVICE_CPU,
) -> Tensor:
    """A tensor over a fresh owned storage (``ctx``'s allocator) large enough for ``strides``."""
    nbytes = packed_extent(sizes, strides) * ITEMSIZE[dtype]
    storage = Storage.allocate(nbytes, ctx.allocator(device_type))
    return Tensor(storage, dtype, sizes, strides, 0)


def adopt_result(t: torch.Tensor, device_type: int = DEVICE_CPU) -> Tensor:
    """Wrap an ATen result as an owned shim tensor on ``device_type`` without copying it."""
    from .storage import tensor_from_torch

    if t.device.type != "cpu":
        raise ShimError(f"fallback produced a {t.device.type} tensor; expected cpu")
    return tensor_from_torch(t, Storage.adopt(t, device_type))


# --- lifetime -----------------------------------------------------------------------------


@shim
def aoti_torch_empty_strided(
    ctx, ndim, sizes_ptr, strides_ptr, dtype, device_type, device_index, ret
):
    check_ndim(ndim)
    sizes = read_i64s(sizes_ptr, ndim, "sizes_ptr")
    strides = (
        read_i64s(strides_ptr, ndim, "strides_ptr") if strides_ptr else contiguous_strides(sizes)
    )
    _check_geometry(sizes, strides)
    alloc = ctx.allocator(device_type, device_index)
    nbytes = packed_extent(sizes, strides) * ITEMSIZE[check_dtype(dtype)]
    ctx.emit(
        ret, Tensor(Storage.allocate(nbytes, alloc), dtype, sizes, strides, 0), "ret_new_tensor"
    )


def _from_blob(
    ctx, data, ndim, sizes_ptr, strides_ptr, offset, dtype, device_type, device_index, ret
):
    check_ndim(ndim)
    sizes = read_i64s(sizes_ptr, ndim, "sizes_ptr")
    strides = read_i64s(strides_ptr, ndim, "strides_ptr") if strides_ptr else None
    strides = contiguous_strides(sizes) if strides is None else strides
    _check_geometry(sizes, strides)
    check_dtype(dtype)
    ctx.allocator(device_type, device_index)
    if offset < 0:
        raise ShimError(f"storage offset {offset} is negative")
    extent = packed_extent(sizes, strides)
    if extent and not data:
        raise ShimError("data is NULL for a tensor with elements")
    nbytes = (offset + extent) * ITEMSIZE[dtype] if extent else 0
    storage = Storage(data or 0, nbytes, owned=False, device_type=device_type)
    ctx.emit(ret, Tensor(storage, dtype, sizes, strides, offset), "ret")


@shim
def aoti_torch_create_tensor_from_blob(
    ctx, data, ndim, sizes_ptr, strides_ptr, offset, dtype, device_type, device_index, ret
):
    _from_blob(
        ctx, data, ndim, sizes_ptr, strides_ptr, offset, dtype, device_type, device_index, ret
    )


@shim
def aoti_torch_create_tensor_from_blob_v2(
    ctx,
    data,
    ndim,
    sizes_ptr,
    strides_ptr,
    offset,
    dtype,
    device_type,
    device_index,
    ret,
    layout,
    opaque_metadata,
    opaque_metadata_size,
):
    if layout != LAYOUT_STRIDED:
        raise ShimError(f"layout {layout} is not supported (only strided)")
    if opaque_metadata_size:
        raise ShimError("opaque metadata (mkldnn tensors) is not supported")
    _from_blob(
        ctx, data, ndim, sizes_ptr, strides_ptr, offset, dtype, device_type, device_index, ret
    )


@shim
def aoti_torch_delete_tensor_object(ctx, tensor):
    ctx.unregister(tensor)


@shim
def aoti_torch_new_uninitialized_tensor(ctx, ret):
    """A placeholder handle (an empty float32 tensor, no memory) that the proxy executor
    fills with an operator's result (``ShimContext.rebind``)."""
    ctx.emit(ret, Tensor(Storage(0, 0, owned=False), DTYPE_FLOAT32, (0,), (1,), 0), "ret")


@shim
def aoti_torch_new_tensor_handle(ctx, orig_handle, new_handle):
    t = ctx.lookup(orig_handle, "orig_handle")
    ctx.emit(new_handle, Tensor(t.storage, t.dtype, t.sizes, t.strides, t.offset))


def _upstream_copy_materialize(ctx, base: Tensor, sizes, strides, offset) -> Tensor:
    """Upstream Metal's behaviour for a view with holes: gather it into a new packed buffer.

    The kernel still indexes with the compiled strides, so upstream reads and writes
    past the copy; the buffer here is padded to the strided extent so that the
    demonstration loses the writes without corrupting the heap.
    """
    view = Tensor(base.storage, base.dtype, sizes, strides, offset).torch()
    packed = contiguous_strides(sizes)
    out = new_owned(ctx, sizes, packed, base.dtype, base.storage.device_type)
    pad = max(packed_extent(sizes, strides), packed_extent(sizes, packed)) * base.itemsize
    if pad > out.storage.nbytes:
        out = Tensor(
            Storage.allocate(pad, ctx.allocator(base.storage.device_type)),
            base.dtype,
            sizes,
            packed,
            0,
        )
    out.torch().copy_(view)
    return out


@shim
def aoti_torch__reinterpret_tensor(ctx, self, ndim, sizes_ptr, strides_ptr, offset_increment, ret):
    base = ctx.lookup(self, "self")
    check_ndim(ndim)
    sizes = read_i64s(sizes_ptr, ndim, "sizes_ptr")
    strides = read_i64s(strides_ptr, ndim, "strides_ptr")
    _check_geometry(sizes, strides)
    offset = base.offset + offset_increment
    _check_fits(base.storage, base.dtype, sizes, strides, offset)
    running = ctx.running  # the model being run carries its policy; else the context's
    mode = ctx.materialize if running is None else running.materialize
    if mode == "upstream_copy" and not is_packed(sizes, strides):
        ctx.emit(
            ret, _upstream_copy_materialize(ctx, base, sizes, strides, offset), "ret_new_tensor"
        )
        return
    ctx.emit(ret, Tensor(base.storage, base.dtype, sizes, strides, offset), "ret_new_tensor")


@shim
def aoti_torch__alloc_from_pool(ctx, self, offset_bytes, dtype, ndim, sizes_ptr, strides_ptr, ret):
    pool = ctx.lookup(self, "self")
    check_ndim(ndim)
    check_dtype(dtype)
    sizes = read_i64s(sizes_ptr, ndim, "sizes_ptr")
    strides = read_i64s(strides_ptr, ndim, "strides_ptr")
    _check_geometry(sizes, strides)
    start = pool.offset * pool.itemsize + offset_bytes
    if start < 0 or start % ITEMSIZE[dtype]:
        raise ShimError(f"offset_bytes {offset_bytes} is negative or not aligned to the dtype")
    offset = start // ITEMSIZE[dtype]
    _check_fits(pool.storage, dtype, sizes, strides, offset)
    ctx.emit(ret, Tensor(pool.storage, dtype, sizes, strides, offset), "ret_new_tensor")


@shim
def aoti_torch_as_strided(ctx, self, sizes_ptr, strides_ptr, ret):
    base = ctx.lookup(self, "self")
    ndim = len(base.sizes)
    sizes = read_i64s(sizes_ptr, ndim, "sizes_ptr")
    strides = read_i64s(strides_ptr, ndim, "strides_ptr")
    _check_geometry(sizes, strides)
    _check_fits(base.storage, base.dtype, sizes, strides, base.offset)
    ctx.emit(ret, Tensor(base.storage, base.dtype, sizes, strides, base.offset))


# --- copies -------------------------------------------------------------------------------


def _copy(dst: Tensor, src: Tensor) -> None:
    if dst.dtype != src.dtype:
        raise ShimError(
            f"dtype mismatch: destination {DTYPE_TO_TORCH[dst.dtype]}, source "
            f"{DTYPE_TO_TORCH[src.dtype]}"
        )
    if dst.numel != src.numel:
        raise ShimError(f"numel mismatch: destination {dst.numel}, source {src.numel}")
    d, s = dst.torch(), src.torch()
    d.copy_(s if d.shape == s.shape else s.reshape(d.shape))


@shim
def aoti_torch_copy_(ctx, self, src, non_blocking):
    _copy(ctx.lookup(self, "self"), ctx.lookup(src, "src"))


@shim
def aoti_torch_tensor_copy_(ctx, src, dst):
    _copy(ctx.lookup(dst, "dst"), ctx.lookup(src, "src"))


@shim
def aoti_torch_assign_tensors(ctx, src, dst):
    _copy(ctx.lookup(dst, "dst"), ctx.lookup(src, "src"))


@shim
def aoti_torch_clone(ctx, self, ret):
    src = ctx.lookup(self, "self")
    out = new_owned(
        ctx, src.sizes, contiguous_strides(src.sizes), src.dtype, src.storage.device_type
    )
    out.torch().copy_(src.torch())
    ctx.emit(ret, out)


@shim
def aoti_torch_clone_preserve_strides(ctx, self, ret):
    src = ctx.lookup(self, "self")
    out = new_owned(ctx, src.sizes, src.strides, src.dtype, src.storage.device_type)
    extent = packed_extent(src.sizes, src.strides)
    # copy the whole strided span so elements between the view's ones keep their values too
    flat = src.torch().as_strided((extent,), (1,), src.offset) if extent else None
    if flat is not None:
        out.torch().as_strided((extent,), (1,), 0).copy_(flat)
    ctx.emit(ret, out)


@shim
def aoti_torch_zero_(ctx, self):
    ctx.lookup(self, "self").torch().zero_()
