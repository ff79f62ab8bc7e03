"""The ``shim_mps.h`` ABI of the emulated Metal device, called exactly as a Metal wrapper calls it.

The MSL executor is replaced here by a recorder (``FakeMsl``) so what the shims hand it
(addresses, int slots, grid and threadgroup sizes) is checked directly; the real executor
runs in the end-to-end tests. References: upstream's ``shim_mps.mm`` / ``et_metal.mm``
semantics (contents pointers, group sizes) and ATen for the values.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from etmetal.shims import c_api, default_context, last_error, memory_stats
from etmetal.shims.emulated_mps import mps_device, mps_kernels

MPS = 13
FLOAT32 = 6


class FakeMslError(Exception):
    pass


class FakeFunction:
    def __init__(self, name: str, indices: tuple[int, ...], calls: list) -> None:
        self.name, self.buffer_indices, self.calls = name, indices, calls

    def dispatch(self, args, threads, group):
        # what a kernel would read: a float at each buffer, or the int64 in a slot
        self.calls.append((self.name, dict(args), tuple(threads), group))


class FakeLibrary:
    def __init__(self, kernels: dict[str, tuple[int, ...]], calls: list) -> None:
        self.kernel_names = tuple(kernels)
        self._kernels, self._calls = kernels, calls

    def function(self, name: str) -> FakeFunction:
        if name not in self._kernels:
            raise FakeMslError(f"no kernel named {name!r}")
        return FakeFunction(name, self._kernels[name], self._calls)


class FakeMsl:
    """``compile_library`` reads kernel names + buffer indices from ``// kernel name 0 1 2``."""

    MslError = FakeMslError

    def __init__(self) -> None:
        self.calls: list = []

    def compile_library(self, source: str) -> FakeLibrary:
        if "#error" in source:
            raise FakeMslError("kernel 'broken': construct `#error` is not supported")
        kernels = {}
        for line in source.splitlines():
            parts = line.split()
            if parts[:2] == ["//", "kernel"]:
                kernels[parts[2]] = tuple(int(p) for p in parts[3:])
        return FakeLibrary(kernels, self.calls)


@pytest.fixture
def fake_msl(monkeypatch):
    fake = FakeMsl()
    monkeypatch.setattr(mps_kernels, "_compiler", lambda: fake)
    return fake


@pytest.fixture
def lib():
    return c_api()


def _library(lib, source: str) -> int:
    h = ctypes.c_void_p()
    rc = lib.aoti_torch_mps_create_shader_library(source.encode(), ctypes.byref(h))
    assert rc == 0, last_error()
    return h.value


def _function(lib, library: int, name: str) -> int:
    h = ctypes.c_void_p()
    rc = lib.aoti_torch_mps_get_kernel_function(library, name.encode(), ctypes.byref(h))
    assert rc == 0, last_error()
    return h.value


def _mps_tensor(lib, sizes, offset: int = 0) -> tuple[int, int]:
    """An mps tensor from empty_strided, and a view of it at ``offset`` elements."""
    n = len(sizes)
    h = ctypes.c_void_p()
    sz = (ctypes.c_int64 * n)(*sizes)
    st = (ctypes.c_int64 * n)(*torch.empty(sizes).stride())
    room = (ctypes.c_int64 * n)(sizes[0] + offset, *sizes[1:])  # the view fits after offset
    assert lib.aoti_torch_empty_strided(n, room, st, FLOAT32, MPS, 0, ctypes.byref(h)) == 0
    view = ctypes.c_void_p()
    rc = lib.aoti_torch__reinterpret_tensor(h.value, n, sz, st, offset, ctypes.byref(view))
    assert rc == 0, last_error()
    return h.value, view.value


def _ptr(lib, h: int) -> int:
    p = ctypes.c_void_p()
    assert lib.aoti_torch_get_data_ptr(h, ctypes.byref(p)) == 0
    return p.value


def test_mps_tensors_report_the_mps_device_and_free_their_storage(lib):
    before = mps_device.live_mps_storages(default_context())
    base, view = _mps_tensor(lib, (4, 4))
    dev = ctypes.c_int32()
    assert lib.aoti_torch_get_device_type(view, ctypes.byref(dev)) == 0
    assert dev.value == MPS == lib.aoti_torch_device_type_mps()
    assert (
        mps_device.live_mps_storages(default_context()) == before + 1
    )  # the view shares the storage
    lib.aoti_torch_delete_tensor_object(view)
    lib.aoti_torch_delete_tensor_object(base)
    assert mps_device.live_mps_storages(default_context()) == before


def test_malloc_memcpy_copy_buffer_free(lib):
    before = mps_device.live_mps_storages(default_context())
    buf = ctypes.c_void_p()
    assert lib.aoti_torch_mps_malloc(ctypes.byref(buf), 64) == 0
    blob = bytes(range(100))
    src = ctypes.create_string_buffer(blob, len(blob))
    mps_device.lend_source(
        default_context(), ctypes.addressof(src), len(blob)
    )  # as a model's weights blob
    # constant 16 bytes read at blob offset 40, stored at buffer offset 8
    assert lib.aoti_torch_mps_memcpy(buf, 8, 40, 16, src) == 0
    assert ctypes.string_at(buf.value + 8, 16) == blob[40:56]
    assert lib.aoti_torch_mps_copy_buffer(src, buf, 8, 0, 32) == 0
    assert ctypes.string_at(buf.value + 32, 8) == blob[:8]
    assert mps_device.live_mps_storages(default_context()) == before + 1
    # writes past the buffer are refused, and the buffer is left as it was
    assert lib.aoti_torch_mps_memcpy(buf, 60, 0, 16, src) == 1
    assert "not inside a buffer from aoti_torch_mps_malloc" in last_error()
    assert lib.aoti_torch_mps_copy_buffer(src, buf, 8, 0, 60) == 1
    assert lib.aoti_torch_mps_free(buf) == 0
    assert mps_device.live_mps_storages(default_context()) == before
    assert lib.aoti_torch_mps_free(buf) == 1
    assert "double free" in last_error()
    zero = ctypes.c_void_p(1)
    assert lib.aoti_torch_mps_malloc(ctypes.byref(zero), 0) == 0 and zero.value is None
    assert lib.aoti_torch_mps_free(None) == 0
    mps_device.withdraw_source(default_context(), ctypes.addressof(src))


def test_copies_find_their_buffer_among_many_and_never_span_two(lib):
    bufs = [ctypes.c_void_p() for _ in range(6)]
    for i, b in enumerate(bufs):
        assert lib.aoti_torch_mps_malloc(ctypes.byref(b), 32 * (i + 1)) == 0
    blob = bytes(range(256))
    src = ctypes.create_string_buffer(blob, len(blob))
    mps_device.lend_source(default_context(), ctypes.addressof(src), len(blob))
    # free two in the middle: the others are still found, the freed ones are not
    for b in (bufs[2], bufs[4]):
        assert lib.aoti_torch_mps_free(b) == 0
    for i, b in enumerate(bufs):
        size = 32 * (i + 1)
        rc = lib.aoti_torch_mps_memcpy(b, size - 16, i, 16, src)  # the last 16 bytes
        if i in (2, 4):
            assert rc == 1 and "not inside a buffer" in last_error()
        else:
            assert rc == 0, last_error()
            assert ctypes.string_at(b.value + size - 16, 16) == blob[i : i + 16]
            assert lib.aoti_torch_mps_memcpy(b, size - 8, 0, 16, src) == 1  # 8 bytes past
    # a pointer just before the lowest buffer belongs to none
    lowest = min(b.value for i, b in enumerate(bufs) if i not in (2, 4))
    assert lib.aoti_torch_mps_copy_buffer(src, lowest - 8, 8, 0, 0) == 1
    for i, b in enumerate(bufs):
        if i not in (2, 4):
            assert lib.aoti_torch_mps_free(b) == 0
    mps_device.withdraw_source(default_context(), ctypes.addressof(src))


def test_kernel_arguments_reach_the_executor_as_upstream_binds_them(lib, fake_msl):
    library = _library(lib, "// kernel k 0 1 2\n")
    fn = _function(lib, library, "k")
    assert _function(lib, library, "k") == fn  # one function object per name
    base, view = _mps_tensor(lib, (8,), offset=3)
    out, out_view = _mps_tensor(lib, (8,))
    assert lib.aoti_torch_mps_start_encoding(fn) == 0
    assert lib.aoti_torch_mps_set_arg_tensor(fn, 0, out) == 0
    assert lib.aoti_torch_mps_set_arg_tensor(fn, 1, view) == 0
    assert lib.aoti_torch_mps_set_arg_int(fn, 2, -(1 << 40)) == 0
    assert lib.aoti_torch_mps_dispatch_single(fn, 5000) == 0
    name, args, threads, group = fake_msl.calls[-1]
    assert name == "k" and threads == (5000,) and group == (1024,)
    assert args[0] == _ptr(lib, out)
    assert args[1] == _ptr(lib, base) + 3 * 4  # the storage offset is part of the address
    assert ctypes.c_int64.from_address(args[2]).value == -(1 << 40)
    for h in (base, view, out, out_view):
        assert lib.aoti_torch_delete_tensor_object(h) == 0
    assert lib.aoti_torch_mps_delete_shader_library(library) == 0


@pytest.mark.parametrize(
    "call, threads, group",
    [
        (("dispatch_single", 100), (100,), (100,)),
        (("dispatch_single_with_group_size", 100, 32), (100,), (32,)),
        (("dispatch_single_with_group_size", 5000, 4096), (5000,), (1024,)),
        (("dispatch_array", (64, 16)), (64, 16), (32, 16)),
        (("dispatch_array", (4, 4, 4)), (4, 4, 4), (4, 4, 4)),
        (("dispatch_array_with_group_size", (1000,), (256,)), (1000,), (256,)),
        (("dispatch_array_with_group_size", (7, 300), (1, 256)), (7, 300), (1, 256)),
    ],
)
def test_grid_and_threadgroup_sizes(lib, fake_msl, call, threads, group):
    library = _library(lib, "// kernel k\n")
    fn = _function(lib, library, "k")
    assert lib.aoti_torch_mps_start_encoding(fn) == 0
    name, *args = call
    c_args = []
    for a in args:
        if isinstance(a, tuple):
            c_args += [(ctypes.c_uint64 * len(a))(*a), len(a)]
        else:
            c_args.append(a)
    assert getattr(lib, f"aoti_torch_mps_{name}")(fn, *c_args) == 0, last_error()
    assert fake_msl.calls[-1][2:] == (threads, group)
    lib.aoti_torch_mps_delete_shader_library(library)


def test_dispatch_with_missing_or_extra_arguments_is_an_error(lib, fake_msl):
    start = mps_device.live_mps_storages(default_context())
    library = _library(lib, "// kernel needs3 0 1 2\n")
    fn = _function(lib, library, "needs3")
    out, out_view = _mps_tensor(lib, (4,))
    lib.aoti_torch_mps_start_encoding(fn)
    lib.aoti_torch_mps_set_arg_tensor(fn, 0, out)
    lib.aoti_torch_mps_set_arg_int(fn, 2, 4)
    assert lib.aoti_torch_mps_dispatch_single(fn, 4) == 1
    assert "'needs3'" in last_error() and "missing buffer index(es) [1]" in last_error()
    lib.aoti_torch_mps_start_encoding(fn)
    for i in (0, 1, 2):
        lib.aoti_torch_mps_set_arg_tensor(fn, i, out)
    lib.aoti_torch_mps_set_arg_int(fn, 5, 1)
    assert lib.aoti_torch_mps_dispatch_single(fn, 4) == 1
    assert "extra argument index(es) [5]" in last_error()
    assert fake_msl.calls == []  # nothing ran
    # dispatch drops the encoder, as upstream: a second dispatch needs start_encoding
    lib.aoti_torch_mps_start_encoding(fn)
    for i in (0, 1, 2):
        lib.aoti_torch_mps_set_arg_tensor(fn, i, out)
    assert lib.aoti_torch_mps_dispatch_single(fn, 4) == 0
    assert lib.aoti_torch_mps_dispatch_single(fn, 4) == 1
    assert "without aoti_torch_mps_start_encoding" in last_error()
    lib.aoti_torch_delete_tensor_object(out)
    lib.aoti_torch_delete_tensor_object(out_view)
    assert mps_device.live_mps_storages(default_context()) == start
    lib.aoti_torch_mps_delete_shader_library(library)


def test_unknown_kernel_and_failing_library_are_errors(lib, fake_msl):
    library = _library(lib, "// kernel present 0\n")
    h = ctypes.c_void_p()
    assert lib.aoti_torch_mps_get_kernel_function(library, b"absent", ctypes.byref(h)) == 1
    assert "'absent'" in last_error() and "present" in last_error()
    assert lib.aoti_torch_mps_create_shader_library(b"#error\n", ctypes.byref(h)) == 1
    assert "failed to compile" in last_error() and "#error" in last_error()
    lib.aoti_torch_mps_delete_shader_library(library)
    # the library's functions die with it
    assert lib.aoti_torch_mps_delete_shader_library(library) == 1
    assert lib.aoti_torch_mps_start_encoding(0x1234) == 1
    assert "not a live kernel function" in last_error()


def test_command_block_calls_back_natively(lib, fake_msl):
    """run_command_block calls the callback with (function, user_data); shared_callback
    is native (it calls a C++ std::function), so a C callback stands in for the block."""
    library = _library(lib, "// kernel k\n")
    fn = _function(lib, library, "k")
    seen = []
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)

    def block(func, user_data):
        seen.append((func, user_data))
        lib.aoti_torch_mps_start_encoding(func)
        lib.aoti_torch_mps_dispatch_single(func, 3)

    cb = proto(block)
    assert lib.aoti_torch_mps_run_command_block(fn, cb, 0xBEEF) == 0, last_error()
    assert seen == [(fn, 0xBEEF)] and fake_msl.calls[-1][2] == (3,)
    assert lib.aoti_torch_mps_run_command_block(fn, None, 0) == 1
    assert "callback is NULL" in last_error()
    assert lib.aoti_torch_mps_run_command_block(0x5678, cb, 0) == 1
    assert len(seen) == 1  # an invalid function never reaches the callback
    lib.aoti_torch_mps_delete_shader_library(library)
    # a NULL std::function pointer is ignored, as upstream
    lib.aoti_torch_mps_shared_callback(fn, None)


def test_no_leaks_after_the_abi_round_trip(lib, fake_msl):
    start = memory_stats().live()
    libs = mps_kernels.library_count(default_context())
    library = _library(lib, "// kernel k 0\n")
    fn = _function(lib, library, "k")
    out, view = _mps_tensor(lib, (16,))
    for _ in range(50):
        lib.aoti_torch_mps_start_encoding(fn)
        lib.aoti_torch_mps_set_arg_tensor(fn, 0, view)
        lib.aoti_torch_mps_dispatch_single(fn, 16)
    lib.aoti_torch_delete_tensor_object(view)
    lib.aoti_torch_delete_tensor_object(out)
    lib.aoti_torch_mps_delete_shader_library(library)
    assert memory_stats().live() == start
    assert mps_kernels.library_count(default_context()) == libs
