"""Hostile call sequences against the emulated Metal device, made exactly as a ``.so`` makes
them (through the C shims of ``etmetal.shims.c_api``).

Each named case (:data:`CASES`) does one thing a bad ``.so`` could do: a dispatch after the
bound tensor was deleted, an int into a pointer slot, a copy reading past its source, grids
that overflow or exceed the launch limit, shader sources that include foreign files. Each
must end in an error code with a readable ``last_error``; :func:`random_sequence` mixes
these moves with valid ones for the fuzz campaign. ``python -m etmetal.testing.mps_hostile
CASE`` runs one case in a fresh process and prints ``{"rc": ..., "error": ...}``, so a
crash shows as a signal in the parent.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import random
import sys
from collections.abc import Callable

MPS, FLOAT32 = 13, 6

KERNELS = """
#include <metal_stdlib>
using namespace metal;
kernel void fill(device float* out [[buffer(0)]], constant long& n [[buffer(1)]],
                 uint i [[thread_position_in_grid]]) {
  if (long(i) < n) out[i] = 7.0f;
}
kernel void scale(device float* out [[buffer(0)]], constant float& k [[buffer(1)]],
                  uint i [[thread_position_in_grid]]) {
  out[i] = k * float(i);
}
"""

# a foreign file's first token must never appear in a message
SECRET = "etmetal_secret_token_7f3a"


def _lib():
    from etmetal.shims import c_api

    return c_api()


def _error() -> str:
    from etmetal.shims import last_error

    return last_error() or ""


def library(lib, source: str) -> tuple[int, int]:
    h = ctypes.c_void_p()
    rc = lib.aoti_torch_mps_create_shader_library(source.encode(), ctypes.byref(h))
    return rc, h.value or 0


def function(lib, library_handle: int, name: bytes) -> int:
    fn = ctypes.c_void_p()
    rc = lib.aoti_torch_mps_get_kernel_function(library_handle, name, ctypes.byref(fn))
    if rc != 0:
        raise RuntimeError(f"get_kernel_function({name!r}) failed: {_error()}")
    return fn.value


def mps_tensor(lib, n: int) -> int:
    """A new owned ``mps`` float tensor of ``n`` elements (its handle)."""
    h = ctypes.c_void_p()
    sizes, strides = (ctypes.c_int64 * 1)(n), (ctypes.c_int64 * 1)(1)
    rc = lib.aoti_torch_empty_strided(1, sizes, strides, FLOAT32, MPS, 0, ctypes.byref(h))
    if rc != 0:
        raise RuntimeError(f"empty_strided failed: {_error()}")
    return h.value


def _fill(lib) -> int:
    rc, lh = library(lib, KERNELS)
    if rc != 0:
        raise RuntimeError(f"the test library does not compile: {_error()}")
    return function(lib, lh, b"fill")


def use_after_free(lib) -> int:
    fn = _fill(lib)
    t = mps_tensor(lib, 1 << 16)
    lib.aoti_torch_mps_start_encoding(fn)
    lib.aoti_torch_mps_set_arg_tensor(fn, 0, t)
    lib.aoti_torch_mps_set_arg_int(fn, 1, 1 << 16)
    lib.aoti_torch_delete_tensor_object(t)
    mps_tensor(lib, 1 << 16)  # what would now live at that address
    return lib.aoti_torch_mps_dispatch_single(fn, 1 << 16)


def int_into_pointer(lib) -> int:
    fn = _fill(lib)
    lib.aoti_torch_mps_start_encoding(fn)
    return lib.aoti_torch_mps_set_arg_int(fn, 0, 12345)


def int_into_float(lib) -> int:
    rc, lh = library(lib, KERNELS)
    fn = function(lib, lh, b"scale")
    lib.aoti_torch_mps_start_encoding(fn)
    return lib.aoti_torch_mps_set_arg_int(fn, 1, 3)


def _buffer(lib, n: int) -> int:
    buf = ctypes.c_void_p()
    if lib.aoti_torch_mps_malloc(ctypes.byref(buf), n) != 0:
        raise RuntimeError(f"mps_malloc failed: {_error()}")
    return buf.value


_keep: list = []  # sources must outlive the call


def _blob(n: int) -> int:
    from etmetal.shims import default_context
    from etmetal.shims.emulated_mps import mps_device

    src = ctypes.create_string_buffer(n)
    _keep.append(src)
    mps_device.lend_source(default_context(), ctypes.addressof(src), n)
    return ctypes.addressof(src)


def memcpy_source_overrun(lib) -> int:
    return lib.aoti_torch_mps_memcpy(_buffer(lib, 64), 0, 1 << 40, 16, _blob(64))


def memcpy_tail_overrun(lib) -> int:
    return lib.aoti_torch_mps_memcpy(_buffer(lib, 64), 0, 56, 16, _blob(64))


def memcpy_destination_overrun(lib) -> int:
    return lib.aoti_torch_mps_memcpy(_buffer(lib, 64), 1 << 40, 0, 16, _blob(64))


def memcpy_foreign_source(lib) -> int:
    foreign = ctypes.create_string_buffer(64)  # not lent, not a buffer, not a tensor
    _keep.append(foreign)
    return lib.aoti_torch_mps_memcpy(_buffer(lib, 64), 0, 0, 16, ctypes.addressof(foreign))


def copy_buffer_source_overrun(lib) -> int:
    src, dst = _buffer(lib, 64), _buffer(lib, 64)
    return lib.aoti_torch_mps_copy_buffer(src, dst, 32, 1 << 40, 0)


def _bound_fill(lib, n: int) -> int:
    fn = _fill(lib)
    t = mps_tensor(lib, 1 << 16)
    _keep.append(t)
    lib.aoti_torch_mps_start_encoding(fn)
    lib.aoti_torch_mps_set_arg_tensor(fn, 0, t)
    lib.aoti_torch_mps_set_arg_int(fn, 1, n)
    return fn


def grid_wraps(lib) -> int:
    fn = _bound_fill(lib, 0)
    grid = (ctypes.c_uint64 * 2)(1 << 32, 1 << 32)
    return lib.aoti_torch_mps_dispatch_array(fn, grid, 2)


def grid_product_wraps(lib) -> int:
    fn = _bound_fill(lib, 0)
    grid = (ctypes.c_uint64 * 3)((1 << 32) - 1, (1 << 32) - 1, (1 << 32) - 1)
    return lib.aoti_torch_mps_dispatch_array(fn, grid, 3)


def launch_too_large(lib) -> int:
    return lib.aoti_torch_mps_dispatch_single(_bound_fill(lib, 0), 1 << 31)


def _compile(lib, source: str) -> int:
    rc, lh = library(lib, source)
    if rc == 0:
        lib.aoti_torch_mps_delete_shader_library(lh)
    return rc


def _foreign_file() -> str:
    import tempfile

    fd, name = tempfile.mkstemp(suffix=".h", prefix="etmetal-foreign-")
    with os.fdopen(fd, "w") as f:
        f.write(f"{SECRET} first line of a foreign file\n")
    atexit.register(os.unlink, name)  # the process leaves nothing behind
    return name


def include_absolute(lib) -> int:
    return _compile(lib, f'#include "{_foreign_file()}"\n' + KERNELS)


def include_system(lib) -> int:
    return _compile(lib, "#include </etc/shadow>\n" + KERNELS)


def include_traversal(lib) -> int:
    return _compile(lib, '#include "../../../../../../etc/passwd"\n' + KERNELS)


def include_behind_comment(lib) -> int:
    return _compile(lib, f'/* x */ #include "{_foreign_file()}"\n' + KERNELS)


def include_digraph(lib) -> int:
    return _compile(lib, f'%:include "{_foreign_file()}"\n' + KERNELS)


def include_spliced(lib) -> int:
    return _compile(lib, f'#inc\\\nlude "{_foreign_file()}"\n' + KERNELS)


def include_by_macro(lib) -> int:
    return _compile(lib, f'#define F "{_foreign_file()}"\n#include F\n' + KERNELS)


def include_next(lib) -> int:
    return _compile(lib, "#include_next <metal_stdlib>\n" + KERNELS)


def include_c10_traversal(lib) -> int:
    return _compile(lib, "#include <c10/metal/../../../../../etc/passwd>\n" + KERNELS)


CASES: dict[str, Callable] = {
    f.__name__: f
    for f in (
        use_after_free,
        int_into_pointer,
        int_into_float,
        memcpy_source_overrun,
        memcpy_tail_overrun,
        memcpy_destination_overrun,
        memcpy_foreign_source,
        copy_buffer_source_overrun,
        grid_wraps,
        grid_product_wraps,
        launch_too_large,
        include_absolute,
        include_system,
        include_traversal,
        include_behind_comment,
        include_digraph,
        include_spliced,
        include_by_macro,
        include_next,
        include_c10_traversal,
    )
}


def run_case(name: str, lib=None) -> tuple[int, str]:
    """Run case ``name``; its return code and ``last_error``."""
    lib = lib if lib is not None else _lib()
    rc = CASES[name](lib)
    return rc, _error() if rc else ""


# --- random sequences (the fuzz family) -----------------------------------------------------


def _floats(lib, handle: int, n: int) -> list[float]:
    ptr = ctypes.c_void_p()
    if lib.aoti_torch_get_data_ptr(handle, ctypes.byref(ptr)) != 0:
        raise RuntimeError(f"get_data_ptr failed: {_error()}")
    return list((ctypes.c_float * n).from_address(ptr.value))


def valid_launch(lib, fn: int, rng: random.Random) -> int:
    """A well-formed ``fill`` launch, checked against what the kernel must write (a wrong
    answer raises)."""
    t = mps_tensor(lib, 1 << 16)
    n = rng.choice([1, 5, 32, 33, 1000, 1 << 16])
    try:
        codes = (
            lib.aoti_torch_mps_start_encoding(fn),
            lib.aoti_torch_mps_set_arg_tensor(fn, 0, t),
            lib.aoti_torch_mps_set_arg_int(fn, 1, n),
            lib.aoti_torch_mps_dispatch_single(fn, rng.choice([n, 1 << 16])),
        )
        if any(codes):
            raise RuntimeError(f"a valid launch failed ({codes}): {_error()}")
        if any(v != 7.0 for v in _floats(lib, t, n)):
            raise RuntimeError(f"a valid launch of {n} threads wrote wrong values")
    finally:
        lib.aoti_torch_delete_tensor_object(t)
    return 0


_MOVES = [
    "tensor",
    "delete",
    "start",
    "start",
    "set_tensor",
    "set_tensor",
    "set_int",
    "set_int",
] + ["dispatch", "dispatch", "dispatch_array", "memcpy", "launch", "case"]


def random_sequence(rng: random.Random, lib=None) -> list[tuple[str, int]]:
    """A random mix of valid and hostile calls on a library's two functions; returns
    (call, rc) pairs. Raises only on a bug: a valid launch that fails or computes wrongly."""
    lib = lib if lib is not None else _lib()
    rc, lh = library(lib, KERNELS)
    if rc != 0:
        raise RuntimeError(f"the fuzz library does not compile: {_error()}")
    fill, scale = function(lib, lh, b"fill"), function(lib, lh, b"scale")
    live: list[int] = []
    dead: list[int] = []
    done: list[tuple[str, int]] = []
    big = [0, 1, 7, 64, 1 << 16, (1 << 31), (1 << 32) - 1, 1 << 32, (1 << 63), (1 << 64) - 1]
    small = [0, 1, 5, 32, 33, 1000, 1 << 16]
    main = rng.choice([fill, fill, scale])  # most calls encode one function
    plan: list[str] = []
    while len(plan) < rng.randint(3, 14):
        if rng.random() < 0.5:  # an encoding round: start, bind (some hostile), dispatch
            binds = [rng.choice(["set_tensor", "set_int", "delete", "tensor"]) for _ in range(3)]
            plan += ["start", "bind0", *binds[: rng.randint(0, 3)], "bind1"]
            plan.append(rng.choice(["dispatch", "dispatch", "dispatch_array"]))
        else:
            plan.append(rng.choice(_MOVES))
    for call in plan:
        fn = main if rng.random() < 0.9 else rng.choice([fill, scale])
        if call == "tensor" or (call == "delete" and not live):
            live.append(mps_tensor(lib, 1 << 16))  # wider than any grid x that runs
            call, rc = "tensor", 0
        elif call == "delete":
            h = live.pop(rng.randrange(len(live)))
            rc = lib.aoti_torch_delete_tensor_object(h)
            dead.append(h)
        elif call == "start":
            rc = lib.aoti_torch_mps_start_encoding(fn)
        elif call == "bind0":  # the output buffer, from a live tensor when there is one
            if not live:
                live.append(mps_tensor(lib, 1 << 16))
            rc = lib.aoti_torch_mps_set_arg_tensor(fn, 0, rng.choice(live))
        elif call == "bind1":  # n for fill (an int), k for scale (a float: a tensor)
            if fn == fill:
                rc = lib.aoti_torch_mps_set_arg_int(fn, 1, rng.choice(small))
            else:
                rc = lib.aoti_torch_mps_set_arg_tensor(fn, 1, rng.choice(live or [1]))
        elif call == "set_tensor":
            idx = rng.choice([0, 0, 0, 1, 1, 2, -1, 31, rng.randrange(1 << 31)])
            pool = (live or dead or [1]) * 4 + dead + [rng.randrange(1, 1 << 48)]
            rc = lib.aoti_torch_mps_set_arg_tensor(fn, idx, rng.choice(pool))
        elif call == "set_int":
            idx = rng.choice([0, 1, 1, 1, 2, -1, 31])
            val = rng.choice(small * 3 + big) - rng.randrange(2)
            rc = lib.aoti_torch_mps_set_arg_int(fn, idx, val)
        elif call == "dispatch":
            rc = lib.aoti_torch_mps_dispatch_single(fn, rng.choice(small * 3 + big[:8]))
        elif call == "dispatch_array":
            n = rng.randint(1, 3)
            grid = (ctypes.c_uint64 * 3)(*(rng.choice(small + big) for _ in range(3)))
            group = (ctypes.c_uint64 * 3)(*(rng.choice([0, 1, 8, 1024, 1 << 40]) for _ in range(3)))
            rc = lib.aoti_torch_mps_dispatch_array_with_group_size(
                fn, grid, n, group, rng.randint(0, 3)
            )
        elif call == "memcpy":
            dst, src = _buffer(lib, 64), _blob(64)
            off, read, size = (rng.choice(big[:6] + [1 << 40]) for _ in range(3))
            rc = lib.aoti_torch_mps_memcpy(dst, off, read, size, src)
            lib.aoti_torch_mps_free(dst)
        elif call == "launch":
            rc = valid_launch(lib, fill, rng)
        else:
            call = rng.choice(sorted(CASES))
            rc = CASES[call](lib)
        done.append((call, rc))
    for h in live:
        lib.aoti_torch_delete_tensor_object(h)
    lib.aoti_torch_mps_delete_shader_library(lh)
    return done


if __name__ == "__main__":
    if sys.argv[1] == "random":
        seq = random_sequence(random.Random(int(sys.argv[2])))
        print(json.dumps({"calls": seq}))
    else:
        rc, err = run_case(sys.argv[1])
        print(json.dumps({"rc": rc, "error": err}))
