"""Fixtures for driving the shims exactly as a compiled ``.so`` does: C names, ctypes pointers."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from etmetal.shims import c_api, clear_last_error, last_error, memory_stats

# pytest runs with --import-mode=importlib: make this folder's helper modules importable
sys.path.insert(0, str(Path(__file__).parent))

FLOAT32 = 6


class CDriver:
    """Thin helpers over the C functions; every call goes through the trampoline."""

    def __init__(self) -> None:
        self.lib = c_api()

    @staticmethod
    def i64s(values) -> ctypes.Array:
        values = list(values)
        return (ctypes.c_int64 * max(len(values), 1))(*values)

    def call(self, name: str, *args) -> int:
        return getattr(self.lib, name)(*args)

    def empty(self, sizes, strides=None, dtype: int = FLOAT32) -> int:
        if strides is None:
            strides = torch.empty(sizes).stride() if sizes else ()
        h = ctypes.c_void_p()
        rc = self.lib.aoti_torch_empty_strided(
            len(sizes), self.i64s(sizes), self.i64s(strides), dtype, 0, 0, ctypes.byref(h)
        )
        assert rc == 0, last_error()
        return h.value

    def reinterpret(self, h: int, sizes, strides, offset: int) -> tuple[int, int | None]:
        out = ctypes.c_void_p()
        rc = self.lib.aoti_torch__reinterpret_tensor(
            h, len(sizes), self.i64s(sizes), self.i64s(strides), offset, ctypes.byref(out)
        )
        return rc, out.value

    def delete(self, h: int | None) -> int:
        return self.lib.aoti_torch_delete_tensor_object(h)

    def ptr(self, h: int) -> int:
        p = ctypes.c_void_p()
        assert self.lib.aoti_torch_get_data_ptr(h, ctypes.byref(p)) == 0, last_error()
        return p.value or 0

    def geometry(self, h: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        dim, sp, st = ctypes.c_int64(), ctypes.c_void_p(), ctypes.c_void_p()
        assert self.lib.aoti_torch_get_dim(h, ctypes.byref(dim)) == 0
        assert self.lib.aoti_torch_get_sizes(h, ctypes.byref(sp)) == 0
        assert self.lib.aoti_torch_get_strides(h, ctypes.byref(st)) == 0
        n = dim.value
        sizes = tuple((ctypes.c_int64 * n).from_address(sp.value)) if n else ()
        strides = tuple((ctypes.c_int64 * n).from_address(st.value)) if n else ()
        dt = ctypes.c_int32()
        assert self.lib.aoti_torch_get_dtype(h, ctypes.byref(dt)) == 0
        return sizes, strides, dt.value

    def read(self, h: int, np_dtype=np.float32) -> np.ndarray:
        """The tensor's values, gathered with numpy from the raw pointer and C getters."""
        sizes, strides, _ = self.geometry(h)
        item = np.dtype(np_dtype).itemsize
        if 0 in sizes:
            return np.zeros(sizes, np_dtype)
        span = (1 + sum((s - 1) * st for s, st in zip(sizes, strides))) * item
        raw = np.frombuffer((ctypes.c_char * span).from_address(self.ptr(h)), dtype=np.uint8)
        flat = raw.view(np_dtype)
        return np.lib.stride_tricks.as_strided(
            flat, sizes, tuple(st * item for st in strides)
        ).copy()

    def write(self, h: int, values: np.ndarray) -> None:
        """Write ``values`` through the tensor's strides at its raw pointer."""
        sizes, strides, _ = self.geometry(h)
        if 0 in sizes:
            return
        item = values.dtype.itemsize
        span = (1 + sum((s - 1) * st for s, st in zip(sizes, strides))) * item
        raw = np.frombuffer((ctypes.c_char * span).from_address(self.ptr(h)), dtype=np.uint8)
        view = np.lib.stride_tricks.as_strided(
            raw.view(values.dtype), sizes, tuple(st * item for st in strides), writeable=True
        )
        view[...] = values.reshape(sizes)

    def from_torch(self, t: torch.Tensor) -> int:
        """A shim tensor that copies ``t`` (owned storage, same strides)."""
        h = self.empty(tuple(t.shape), tuple(t.stride()))
        self.write(h, t.detach().numpy())
        return h

    def expect_failure(self, name: str, *args, mentions: str) -> str:
        clear_last_error()
        rc = self.call(name, *args)
        assert rc == 1, f"{name} should fail"
        msg = last_error()
        assert msg.startswith(name) and mentions in msg, msg
        return msg


@pytest.fixture
def cdrv():
    before = memory_stats()
    drv = CDriver()
    yield drv
    assert memory_stats().live() == before.live(), "test leaked shim tensors"
