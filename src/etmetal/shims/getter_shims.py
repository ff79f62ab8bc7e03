"""Getters, scalars, modes and diagnostics: the ``aoti_torch_*`` shims that read tensors.

Every shim takes its ``ShimContext`` first (``registry``).
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Callable
from operator import attrgetter, methodcaller

from etmetal.shims.abi_codes import DTYPE_CODES, ITEMSIZE, LAYOUT_STRIDED
from etmetal.shims.tensor_shims import check_dtype, new_owned

from .registry import ShimTable, put_bool, put_i32, put_i64, put_ptr
from .storage import ShimError, Tensor, contiguous_strides

# this module's shims: registered on a context by whoever builds it, never on import
SHIMS = ShimTable()
shim = SHIMS.shim
shim_as = SHIMS.add

# --- getters ------------------------------------------------------------------------------


def _is_contiguous(t: Tensor) -> bool:
    want = contiguous_strides(t.sizes)
    return all(s == 1 or st == w for s, st, w in zip(t.sizes, t.strides, want))


# the getters that write one property of a tensor:
# C name -> (out-parameter, how it is written, what it reads off the tensor)
_GETTERS: dict[str, tuple[str, Callable, Callable[[Tensor], object]]] = {
    "aoti_torch_get_data_ptr": ("ret_data_ptr", put_ptr, attrgetter("data_ptr")),
    "aoti_torch_get_storage_size": ("ret_size", put_i64, attrgetter("storage.nbytes")),
    "aoti_torch_get_storage_numel": (
        "ret_numel", put_i64, lambda t: t.storage.nbytes // t.itemsize
    ),
    "aoti_torch_get_dim": ("ret_dim", put_i64, lambda t: len(t.sizes)),
    "aoti_torch_get_numel": ("ret_numel", put_i64, attrgetter("numel")),
    "aoti_torch_get_sizes": ("ret_sizes", put_ptr, methodcaller("c_sizes")),
    "aoti_torch_get_strides": ("ret_strides", put_ptr, methodcaller("c_strides")),
    "aoti_torch_get_dtype": ("ret_dtype", put_i32, attrgetter("dtype")),
    "aoti_torch_get_device_type": ("ret_device_type", put_i32, attrgetter("storage.device_type")),
    "aoti_torch_get_device_index": ("ret_device_index", put_i32, lambda t: 0),
    "aoti_torch_get_layout": ("ret_layout", put_i32, lambda t: LAYOUT_STRIDED),
    "aoti_torch_get_storage_offset": ("ret_storage_offset", put_i64, attrgetter("offset")),
    "aoti_torch_is_contiguous": ("ret_is_contiguous", put_bool, _is_contiguous),
}  # fmt: skip


def _getter(out_name: str, put: Callable, read: Callable[[Tensor], object]) -> Callable:
    def getter(ctx, tensor, ret):
        put(ret, read(ctx.lookup(tensor)), out_name)

    return getter


for _name, _spec in _GETTERS.items():
    shim_as(_name, _getter(*_spec))


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
