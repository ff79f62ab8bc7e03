"""The native proxy executor: extern-node tables parsed once, operators run from C++.

``shims/proxy_executor.py`` is the reference: it parses a table in Python and runs each
call through ``torch.ops``. This is the same executor in C++ (``proxy_parse.cpp`` reads a
table, ``proxy_native.cpp`` runs its calls), for
the native implementation and for runtimes without Python (the stock backend):

- ``etm_proxy_parse`` reads the table once, with a small strict JSON reader
  (``json_reader.cpp``: torch's and the executorch wheel's headers ship none), into a list
  of calls: each node's operator, found by name in libtorch's dispatcher and checked
  against the allow-list, and where each schema argument's value comes from. Any
  malformed field is an error naming the node and the field.
- The allow-list's rules are :mod:`.extern_ops`'s, written into ``proxy_rules.h`` by
  :mod:`.proxy_rules` at build time; what only the running process knows (the names
  ``allow_extern_operator`` gave, the custom ops ``torch.library`` defined) is passed in
  at parse time.
- ``etm_proxy_call`` wraps the caller's records as ATen tensors (no copy), runs the
  operator boxed through the dispatcher, and rebinds each output handle to the storage
  libtorch made (``etm_native_rebind``).

It is its own library, ``libetmetal_proxy.so``, the one etmetal build linked against
libtorch's C++ API; the bridge and the stock backend reach it through one function
pointer (``proxy_host.cpp``) and build without libtorch.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from etmetal.common.native_build import WARNINGS, NativeBuildError, build_files

from . import extern_ops, native_tensors, proxy_rules

HERE = Path(__file__).parent
SOURCES = ("proxy_native.cpp", "proxy_parse.cpp", "json_reader.cpp")
HEADERS = ("proxy_native.h", "proxy_nodes.h", "json_reader.h")
LIB_NAME = "libetmetal_proxy.so"
# the bridge's side (compiled into the bridge and the stock backend)
HOST_SOURCE = HERE / "proxy_host.cpp"
HOST_HEADERS = (HERE / "proxy_host.h", HERE / "proxy_native.h")
PROXY_SHIM = "aoti_torch_proxy_executor_call_function"
JSON_READER = HERE / "json_reader.cpp"
ERROR_BYTES = 4096

# the bridge's native paths (bridge._native_path): a proxy call of a handle a native
# executor serves, and the placeholders its outputs are rebound in
NATIVE_PATHS = {
    PROXY_SHIM: (
        "  if (etm_proxy_native(a0, a1, a2, (const int64_t*)a3, a4, (void* const*)a5) > 0) "
        "{ ETM_HIT_NATIVE(); return 0; }\n"
    ),
    "aoti_torch_new_uninitialized_tensor": (
        "  if (etm_native_fallbacks && etm_native_placeholder((void**)a0)) "
        "{ ETM_HIT_NATIVE(); return 0; }\n"
    ),
}


class NativeProxyError(RuntimeError):
    """The proxy library could not be built or loaded."""


def json_reader_files() -> dict[str, bytes]:
    """The strict JSON reader, which the stock backend's weights-index reader shares."""
    return {p.name: p.read_bytes() for p in (JSON_READER, JSON_READER.with_suffix(".h"))}


def host_files() -> dict[str, bytes]:
    """The files the bridge's build adds for the native path."""
    return {p.name: p.read_bytes() for p in (HOST_SOURCE, *HOST_HEADERS)}


def _torch_dirs() -> tuple[list[str], Path]:
    from torch.utils.cpp_extension import include_paths, library_paths

    return include_paths(), Path(library_paths()[0])


def torch_compile_flags() -> list[str]:
    """What a unit including torch's C++ headers is compiled with (its build's flags)."""
    includes, _ = _torch_dirs()
    flags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    for inc in includes:  # torch's headers are not ours to hold to -Werror
        flags += ["-isystem", inc]
    return flags


def build_library() -> Path:
    """Build ``libetmetal_proxy.so`` unless the cache has this exact build; its path."""
    _, lib = _torch_dirs()
    files = {name: (HERE / name).read_bytes() for name in (*SOURCES, *HEADERS)}
    files[native_tensors.HEADER.name] = native_tensors.HEADER.read_bytes()
    files[proxy_rules.HEADER_NAME] = proxy_rules.generate().encode()
    # only the ETM_EXPORT functions leave the library
    flags = ["-O2", "-std=c++17", "-fvisibility=hidden", *WARNINGS, *torch_compile_flags()]
    try:
        return build_files(
            "proxy",
            LIB_NAME,
            files,
            list(SOURCES),
            lang="c++",
            flags=tuple(flags),
            link=(f"-L{lib}", "-ltorch", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}"),
        )
    except NativeBuildError as exc:
        raise NativeProxyError(f"building {LIB_NAME}: {exc}") from exc


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded proxy library (one per process: the dynamic loader's handle is)."""
    path = build_library()
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise NativeProxyError(f"loading {path} failed: {exc}") from exc
    vp, i64, cp = ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p
    strs = ctypes.POINTER(ctypes.c_char_p)
    lib.etm_proxy_parse.argtypes = [cp, i64, strs, i64, strs, i64, cp, i64]
    lib.etm_proxy_parse.restype = vp
    lib.etm_proxy_free.argtypes = [vp]
    lib.etm_proxy_free.restype = None
    lib.etm_proxy_node_count.argtypes = [vp]
    lib.etm_proxy_node_count.restype = i64
    lib.etm_proxy_refusal.argtypes = [cp, strs, i64, strs, i64, cp, i64]
    lib.etm_proxy_refusal.restype = i64
    lib.etm_proxy_last_error.argtypes = []
    lib.etm_proxy_last_error.restype = cp
    return lib


def library_path() -> Path:
    """Where the built proxy library is (what the stock backend and the runner load)."""
    return build_library()


def _names(items: tuple[str, ...]):
    arr = (ctypes.c_char_p * max(len(items), 1))(*(s.encode() for s in items))
    return arr, len(items)


def process_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What only this process knows of the allow-list: explicit names, custom ops."""
    return extern_ops.explicit_names(), extern_ops.custom_op_qualnames()


def refusal(target: str) -> str:
    """Why the native executor refuses a table naming ``target`` ("" when it accepts):
    the check each node's target gets at parse time."""
    lib = library()
    allowed, custom = process_names()
    a, na = _names(allowed)
    c, nc = _names(custom)
    buf = ctypes.create_string_buffer(ERROR_BYTES)
    lib.etm_proxy_refusal(target.encode(), a, na, c, nc, buf, ERROR_BYTES)
    return buf.value.decode(errors="replace")


class NativeProxyExecutor:
    """One table parsed by the native executor; ``address`` is what the bridge binds."""

    def __init__(self, text: str | bytes) -> None:
        self.address = None  # set before anything can fail: close() reads it
        self._lib = lib = library()
        data = text.encode() if isinstance(text, str) else bytes(text)
        allowed, custom = process_names()
        a, na = _names(allowed)
        c, nc = _names(custom)
        buf = ctypes.create_string_buffer(ERROR_BYTES)
        self.address = lib.etm_proxy_parse(data, len(data), a, na, c, nc, buf, ERROR_BYTES)
        if not self.address:
            raise extern_ops.ExternNodeError(buf.value.decode(errors="replace"))
        self.nodes = lib.etm_proxy_node_count(self.address)

    def close(self) -> None:
        if self.address:
            self._lib.etm_proxy_free(self.address)
            self.address = None

    def __del__(self) -> None:
        self.close()


def entry_address() -> int:
    """The address of ``etm_proxy_call`` (what the bridge's ``etm_proxy_entry`` holds)."""
    return ctypes.cast(library().etm_proxy_call, ctypes.c_void_p).value


def calls() -> int:
    """Calls the native executor served since the library was loaded."""
    return ctypes.c_uint64.in_dll(library(), "etm_proxy_calls").value
