"""Register etmetal's native MetalBackend into the stock ExecuTorch runtime of this process.

The library is loaded RTLD_LOCAL: its static constructor registers "MetalBackend" with the
``libexecutorch.so`` that ``executorch.runtime`` already loaded (the library links that same
file), and none of its ``aoti_torch_*`` enters the process-wide scope, so torch's own AOTI
runner loaded later still binds to libtorch (checked after loading, with ``dlopen(NULL)``).
Configuring it is a C call (``etm_stock_configure``), the one a Python-free runner makes too;
Python only checks first that the libtorch functions the fallbacks call have the signatures
torch's installed headers declare.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from etmetal.shims import native_fallbacks, proxy_native

from .build import PUBLIC_HEADER, build_library

BACKEND_ID = "MetalBackend"
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: Path | None = None


class StockRuntimeError(RuntimeError):
    """etmetal's backend could not be built, loaded, registered or configured."""


def _bind(lib: ctypes.CDLL) -> None:
    lib.etm_stock_last_error.restype = ctypes.c_char_p
    lib.etm_stock_registration.restype = ctypes.c_int32
    lib.etm_stock_configure.argtypes, lib.etm_stock_configure.restype = (
        [ctypes.c_char_p],
        ctypes.c_int32,
    )
    lib.etm_stock_set_policy.argtypes = [ctypes.c_int32, ctypes.c_char_p]
    lib.etm_stock_set_policy.restype = None
    lib.etm_stock_live_delegates.restype = ctypes.c_int64
    lib.etm_stock_shared_entries.restype = ctypes.c_int64
    lib.etm_stock_describe.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    lib.etm_stock_describe.restype = ctypes.c_int64
    lib.etm_stock_configure_proxy.argtypes = [ctypes.c_char_p]
    lib.etm_stock_configure_proxy.restype = ctypes.c_int32
    lib.etm_stock_set_extern_names.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.etm_stock_set_extern_names.restype = None
    lib.etm_stock_configure_msl.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_uint32,
    ]
    lib.etm_stock_configure_msl.restype = ctypes.c_int32
    lib.etm_stock_mps_libraries.restype = ctypes.c_int64
    lib.etm_stock_mps_compiles.restype = ctypes.c_int64


def _load() -> ctypes.CDLL:
    global _lib, _path
    from executorch.runtime import Runtime  # loads libexecutorch.so (the pybind module's)

    path = build_library()
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise StockRuntimeError(f"loading {path} failed: {exc}") from exc
    _bind(lib)
    code = lib.etm_stock_registration()
    if code != 0:
        raise StockRuntimeError(
            f"{path.name}: registering {BACKEND_ID!r} failed with ExecuTorch error {code} (is "
            "another MetalBackend registered in this process?)"
        )
    native_fallbacks.check_signatures(lib)
    if lib.etm_stock_configure(str(native_fallbacks.libtorch_cpu_path()).encode()) != 0:
        raise StockRuntimeError(lib.etm_stock_last_error().decode(errors="replace"))
    # the proxy executor of delegates with an extern-node table (its own library, the one
    # linked against libtorch's C++ API)
    if lib.etm_stock_configure_proxy(str(proxy_native.library_path()).encode()) != 0:
        raise StockRuntimeError(lib.etm_stock_last_error().decode(errors="replace"))
    # the emulated Metal device's shader libraries: the stock shader index of this cache,
    # and this interpreter to compile a library the index lacks (in a subprocess)
    if configure_msl(lib) != 0:
        raise StockRuntimeError(lib.etm_stock_last_error().decode(errors="replace"))
    leaked = [n for n in ("aoti_torch_empty_strided", "etm_run") if hasattr(ctypes.CDLL(None), n)]
    if leaked:
        raise StockRuntimeError(f"{path.name} put {leaked} into the process-wide scope")
    if BACKEND_ID not in Runtime.get().backend_registry.registered_backend_names:
        raise StockRuntimeError(f"{BACKEND_ID!r} is not in the stock runtime's backend registry")
    _lib, _path = lib, path
    return lib


def msl_settings() -> dict[str, str]:
    """What the native side needs to find and make compiled shader libraries: the cache
    root, the compiler's toolchain digest, the interpreter that compiles a missing library,
    threadgroup workers (``etmetal_runner`` reads them from ``ETMETAL_MSL_*``)."""
    import torch

    from etmetal.common.cache import cache_root, prepare_root
    from etmetal.shims.emulated_mps.stock_msl import toolchain_digest

    return {
        "ETMETAL_MSL_ROOT": str(prepare_root(cache_root()).resolve()),
        "ETMETAL_MSL_TOOLCHAIN": toolchain_digest(),
        "ETMETAL_MSL_PYTHON": sys.executable,
        "ETMETAL_MSL_WORKERS": str(max(1, torch.get_num_threads())),
    }


def configure_msl(lib: ctypes.CDLL) -> int:
    settings = msl_settings()
    return lib.etm_stock_configure_msl(
        settings["ETMETAL_MSL_ROOT"].encode(),
        settings["ETMETAL_MSL_TOOLCHAIN"].encode(),
        settings["ETMETAL_MSL_PYTHON"].encode(),
        int(settings["ETMETAL_MSL_WORKERS"]),
    )


def register(trust_native_code: bool = False, trusted_blob_hashes: Iterable[str] = ()) -> None:
    """Make the stock runtime (``executorch.runtime``) run Metal host delegates natively.

    Builds the library on first use (content cache) and loads it once; every call sets the
    trust policy anew: ``trust_native_code`` runs any delegate's ``.so``;
    ``trusted_blob_hashes`` lists delegate digests (or, for a host delegate without an
    extern-node table, ``.so`` digests). ``ETMETAL_TRUST_NATIVE_CODE`` and
    ``ETMETAL_TRUSTED_BLOBS`` apply as in etmetal's runtime. Extern-node tables may name
    the custom operators ``torch.library`` defined before this call (and those
    ``allow_extern_operator`` named): call it again after defining more.
    """
    hashes = [str(h).strip() for h in trusted_blob_hashes]
    bad = [h for h in hashes if "," in h]
    if bad:
        raise ValueError(f"a trusted hash cannot contain ',': {bad[0]!r}")
    with _lock:
        lib = _lib if _lib is not None else _load()
        lib.etm_stock_set_policy(int(bool(trust_native_code)), ",".join(hashes).encode())
        # what this process allows extern-node tables beyond the rules: the names
        # allow_extern_operator gave and the custom ops torch.library defined, as of now
        allowed, custom = proxy_native.process_names()
        lib.etm_stock_set_extern_names("\n".join(allowed).encode(), "\n".join(custom).encode())


def _library() -> ctypes.CDLL:
    if _lib is None:
        raise StockRuntimeError("etmetal.stock_runtime.register() has not been called")
    return _lib


def library_path() -> Path:
    """The built ``libetmetal_stock.so`` (built if needed; a runner links it and calls the
    C API of ``header_path()``)."""
    return _path if _path is not None else build_library()


def header_path() -> Path:
    """``etmetal_stock.h``: the library's C API (configure, trust policy, last error)."""
    return PUBLIC_HEADER


def last_error() -> str:
    """The message of the backend's last failure ("" if none)."""
    return _library().etm_stock_last_error().decode(errors="replace")


@dataclass(frozen=True)
class LentConstant:
    """A constant a live delegate lent its container (the shared-weights layout)."""

    where: str  # "method 'decode': MetalBackend delegate"
    name: str
    key: str
    address: int
    mutable: bool


def lent_constants() -> list[LentConstant]:
    """Every constant the live delegates lent, in delegate creation order."""
    lib = _library()
    need = lib.etm_stock_describe(None, 0)
    buf = ctypes.create_string_buffer(need)
    lib.etm_stock_describe(buf, need)
    rows = [line.split("\t") for line in buf.value.decode().splitlines() if line]
    return [LentConstant(w, n, k, int(a), m == "1") for w, n, k, a, m in rows]


def native_counts() -> dict[str, int]:
    """The native layer's counters: live records, live owned storages, their bytes,
    borrowed records, shim calls that went to the (unbound) Python half, live delegates,
    entries of the shared constant cache."""
    lib = _library()
    counts = {
        name: ctypes.c_int64.in_dll(lib, f"etm_native_{name}").value
        for name in ("live", "stores", "bytes", "borrowed")
    }
    rows = ctypes.c_int64.in_dll(lib, "etm_shim_rows").value
    counts["python_calls"] = sum((ctypes.c_uint64 * max(rows, 1)).in_dll(lib, "etm_shim_python"))
    counts["delegates"] = lib.etm_stock_live_delegates()
    counts["shared_entries"] = lib.etm_stock_shared_entries()
    counts["shader_libraries"] = lib.etm_stock_mps_libraries()
    counts["shader_compiles"] = lib.etm_stock_mps_compiles()
    counts["mps_storages"] = sum(
        ctypes.c_int64.in_dll(lib, f"etm_native_mps_{name}").value
        for name in ("stores", "borrowed")
    )
    return counts


def shim_calls() -> int:
    """Shim calls the backend's native layer has answered since it was loaded (a running
    total, unlike :func:`native_counts`, which holds at its steady value)."""
    return ctypes.c_uint64.in_dll(_library(), "etm_calls").value
