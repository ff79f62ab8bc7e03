"""Getters, scalars, modes and diagnostics: the ``aoti_torch_*`` shims that read tensors.

Every shim takes its ``ShimContext`` first (``registry``).
"""

from __future__ import annotations

import ctypes
import warnings

from .core import check_dtype, new_owned
from .dtypes import DTYPE_CODES, ITEMSIZE, LAYOUT_STRIDED
from .registry import put_bool, put_i32, put_i64, put_ptr, shim, shim_as
from .storage import ShimError, Tensor, contiguous_strides

# --- getters ------------------------------------------------------------------------------


@shim
def aoti_torch_get_data_ptr(ctx, tensor, ret_data_ptr):
    put_ptr(ret_data_ptr, ctx.lookup(tensor).data_ptr, "ret_data_ptr")


@shim
def aoti_torch_get_storage_size(ctx, tensor, ret_size):
    put_i64(ret_size, ctx.lookup(tensor).storage.nbytes, "ret_size")


@shim
def aoti_torch_get_storage_numel(ctx, tensor, ret_numel):
    t = ctx.lookup(tensor)
    put_i64(ret_numel, t.storage.nbytes // t.itemsize, "ret_numel")


@shim
def aoti_torch_get_dim(ctx, tensor, ret_dim):
    put_i64(ret_dim, len(ctx.lookup(tensor).sizes), "ret_dim")


@shim
def aoti_torch_get_numel(ctx, tensor, ret_numel):
    put_i64(ret_numel, ctx.lookup(tensor).numel, "ret_numel")


@shim
def aoti_torch_get_sizes(ctx, tensor, ret_sizes):
    put_ptr(ret_sizes, ctx.lookup(tensor).c_sizes(), "ret_sizes")


@shim
def aoti_torch_get_strides(ctx, tensor, ret_strides):
    put_ptr(ret_strides, ctx.lookup(tensor).c_strides(), "ret_strides")


def _dim(t: Tensor, d: int) -> int:
    n = len(t.sizes)
    if not -n <= d < n:
        raise ShimError(f"dim {d} out of range for a {n}-d tensor")
    return d % n


@shim
def aoti_torch_get_size(ctx, tensor, d, ret_size):
    t = ctx.lookup(tensor)
    put_i64(ret_size, t.sizes[_dim(t, d)], "ret_size")


@shim
def aoti_torch_get_stride(ctx, tensor, d, ret_stride):
    t = ctx.lookup(tensor)
    put_i64(ret_stride, t.strides[_dim(t, d)], "ret_stride")


@shim
def aoti_torch_get_dtype(ctx, tensor, ret_dtype):
    put_i32(ret_dtype, ctx.lookup(tensor).dtype, "ret_dtype")


@shim
def aoti_torch_get_device_type(ctx, tensor, ret_device_type):
    put_i32(ret_device_type, ctx.lookup(tensor).storage.device_type, "ret_device_type")


@shim
def aoti_torch_get_device_index(ctx, tensor, ret_device_index):
    ctx.lookup(tensor)
    put_i32(ret_device_index, 0, "ret_device_index")


@shim
def aoti_torch_get_layout(ctx, tensor, ret_layout):
    ctx.lookup(tensor)
    put_i32(ret_layout, LAYOUT_STRIDED, "ret_layout")


@shim
def aoti_torch_get_storage_offset(ctx, tensor, ret_storage_offset):
    put_i64(ret_storage_offset, ctx.lookup(tensor).offset, "ret_storage_offset")


@shim
def aoti_torch_is_contiguous(ctx, tensor, ret_is_contiguous):
    t = ctx.lookup(tensor)
    want = contiguous_strides(t.sizes)
    ok = all(s == 1 or st == w for s, st, w in zip(t.sizes, t.strides, want))
    put_bool(ret_is_contiguous, ok, "ret_is_contiguous")


@shim
def aoti_torch_is_defined(ctx, tensor, ret_is_defined):
    put_bool(ret_is_defined, ctx.is_live(tensor), "ret_is_defined")


@shim
def aoti_torch_get_current_device_index(ctx, ret_device_index):
    put_i32(ret_device_index, 0, "ret_device_index")


# --- modes, diagnostics -------------------------------------------------------------------


@shim
def aoti_torch_grad_mode_is_enabled(ctx):
    return ctx.grad_enabled


@shim
def aoti_torch_grad_mode_set_enabled(ctx, enabled):
    ctx.grad_enabled = bool(enabled)


@shim
def aoti_torch_dtype_element_size(ctx, dtype):
    return ITEMSIZE[check_dtype(dtype)]


@shim
def aoti_torch_warn(ctx, func, file, line, msg):
    text = ctypes.string_at(msg).decode(errors="replace") if msg else ""
    where = ctypes.string_at(func).decode(errors="replace") if func else "?"
    warnings.warn(f"AOTI warning in {where} (line {line}): {text}", RuntimeWarning, stacklevel=1)


@shim
def aoti_torch_print_tensor_handle(ctx, self, msg):
    t = ctx.lookup(self, "self")
    label = ctypes.string_at(msg).decode(errors="replace") if msg else ""
    print(f"[etmetal] {label} {t.torch()}")


# --- scalars ------------------------------------------------------------------------------

_ITEM_TYPES = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "uint8": ctypes.c_uint8,
    "int8": ctypes.c_int8,
    "int16": ctypes.c_int16,
    "int32": ctypes.c_int32,
    "int64": ctypes.c_int64,
    "bool": ctypes.c_bool,
}


def _item_shim(name: str, ctype) -> None:
    code = DTYPE_CODES[name]

    def item(ctx, tensor, ret_value):
        t = ctx.lookup(tensor)
        if t.numel != 1:
            raise ShimError(f"item() needs exactly one element, the tensor has {t.numel}")
        if t.dtype != code:
            raise ShimError(f"tensor dtype code {t.dtype} is not {name}")
        if not ret_value:
            raise ShimError("output pointer ret_value is NULL")
        ctype.from_address(ret_value).value = t.torch().item()

    def scalar_to_tensor(ctx, value, ret_new_tensor):
        out = new_owned(ctx, (), (), code)
        out.torch().fill_(value)
        ctx.emit(ret_new_tensor, out, "ret_new_tensor")

    shim_as(f"aoti_torch_item_{name}", item)
    shim_as(f"aoti_torch_scalar_to_tensor_{name}", scalar_to_tensor)


for _name, _ctype in _ITEM_TYPES.items():
    _item_shim(_name, _ctype)
