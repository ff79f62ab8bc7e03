"""The native bridge: a generated C++ trampoline that exports the ``aoti_torch_*`` symbols.

A ``.so`` built with ``link_libtorch=False`` leaves the shim functions undefined.
The trampoline defines one function per shim with the exact C signature (from
torch's headers, see ``abi``): constant shims (dtype/device/layout codes) return
their value directly; every other one counts the call and forwards to a function
pointer that is set, at load, to a ctypes callback of the Python implementation.
``aoti_torch_check(false, ...)`` throws ``std::runtime_error`` like libtorch does,
so the model container turns it into an error code.

It is compiled with the system C++ compiler on first use and cached by content hash
under ``<cache>/bridge/`` (rebuilt if missing), then loaded RTLD_LOCAL: its symbols
never enter the process-wide scope, so a ``link_libtorch=True`` ``.so`` loaded later
(torch's own runner) still binds to libtorch. A model reaches the bridge through a
per-model wrapper (``native.link_wrapper``) that needs the bridge and the model, and
is itself loaded RTLD_LOCAL. ``Bridge.calls`` counts calls that reached etmetal;
``AotiModel`` uses it to prove the binding.

A bridge serves one ``ShimContext``: each callback calls ``impl(ctx, *c_args)`` with
that context, and the context owns the bridge's record table and native tensors.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from etmetal.shims.abi_codes import constant_shims
from etmetal.shims.model_link import WARNINGS, NativeBuildError, build_files, cache_root
from etmetal.shims.record_table import Records

from . import (
    abi,
    fallback_codegen,
    int4_kernel,
    native_custom_ops,
    native_fallbacks,
    native_tensors,
    proxy_native,
)
from .device import BridgeSource


class ShimContext(Protocol):
    """What a bridge needs of the context it serves (``context.ShimContext`` is the one; the
    bridge sits below it, so it names the needs instead of importing the class)."""

    shims: Mapping[str, Callable]

    def record_error(self, shim: str, message: str) -> None: ...

    def attach_native(self, records: Records, native: native_tensors.NativeTensors) -> None: ...

    def load_bridge(self) -> Bridge: ...

    def bridge_sources(self) -> list[BridgeSource]: ...


CHECK_SHIM = "aoti_torch_check"


def _unbind_at_exit(bridge_ref: weakref.ref) -> None:
    """Delete the context's open model containers while the shims still reach Python (a
    user need not destroy methods before exiting), then unbind them."""
    bridge = bridge_ref()
    if bridge is not None:
        try:
            bridge.context.close_models()
        finally:
            bridge.unbind()


class BridgeError(RuntimeError):
    """The trampoline could not be generated, built, loaded or bound."""


def cache_dir() -> Path:
    return cache_root() / "bridge"


def _params(decl: abi.Decl) -> str:
    return ", ".join(f"{t} a{i}" for i, t in enumerate(decl.argtypes)) or "void"


# getters answered from the handle's record in C (no Python call): condition, body
_NATIVE_GETTERS = {
    "aoti_torch_get_data_ptr": ("a1", "*(void**)a1 = (void*)(intptr_t)r->data_ptr;"),
    "aoti_torch_get_dim": ("a1", "*(int64_t*)a1 = r->dim;"),
    "aoti_torch_get_sizes": ("a1", "*(int64_t**)a1 = r->sizes;"),
    "aoti_torch_get_strides": ("a1", "*(int64_t**)a1 = r->strides;"),
    "aoti_torch_get_dtype": ("a1", "*(int32_t*)a1 = r->dtype;"),
    "aoti_torch_get_device_type": ("a1", "*(int32_t*)a1 = r->device_type;"),
    "aoti_torch_get_device_index": ("a1", "*(int32_t*)a1 = 0;"),
    "aoti_torch_get_storage_offset": ("a1", "*(int64_t*)a1 = r->offset;"),
    "aoti_torch_get_numel": ("a1", "*(int64_t*)a1 = r->numel;"),
    "aoti_torch_get_size": (
        "a2 && a1 >= -r->dim && a1 < r->dim",
        "*(int64_t*)a2 = r->sizes[a1 < 0 ? a1 + r->dim : a1];",
    ),
    "aoti_torch_get_stride": (
        "a2 && a1 >= -r->dim && a1 < r->dim",
        "*(int64_t*)a2 = r->strides[a1 < 0 ? a1 + r->dim : a1];",
    ),
}


# thread-global mode flags kept in C: AOTI toggles grad mode around every run
_NATIVE_BODIES = {
    "aoti_torch_grad_mode_is_enabled": "return etm_grad_enabled;",
    "aoti_torch_grad_mode_set_enabled": "etm_grad_enabled = a0; return;",
}


# how a native path counts the call it serves (etm_calls, the total, stays as it was)
_COUNT = "__atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED);"


def _native_path(decl: abi.Decl, device_paths: Mapping[str, str]) -> str:
    # a source's own path wins: it may wrap the standard one (the stock runtime's events)
    served = (
        device_paths.get(decl.name)
        or native_tensors.NATIVE_PATHS.get(decl.name)
        or native_fallbacks.NATIVE_PATHS.get(decl.name)
        or proxy_native.NATIVE_PATHS.get(decl.name)
    )
    if served is not None:
        return served.replace(_COUNT, "ETM_HIT_NATIVE();")
    body = _NATIVE_BODIES.get(decl.name)
    if body is not None:
        return f"  ETM_HIT_NATIVE();\n  {body}\n"
    fast = _NATIVE_GETTERS.get(decl.name)
    if fast is None:
        return ""
    cond, body = fast
    return (
        "  { etm_rec* r = etm_rec_of(a0);\n"
        f"    if (r && {cond}) {{ ETM_HIT_NATIVE(); {body} return 0; }} }}\n"
    )


def _releases(name: str) -> bool:
    """A shim that gives something back (a tensor, a buffer, a shader library)."""
    return any(word in name for word in ("delete", "free", "release", "destroy"))


def _forwarder(decl: abi.Decl, device_paths: Mapping[str, str], index: int) -> str:
    n = decl.name
    call = f"f({', '.join(f'a{i}' for i in range(len(decl.argtypes)))})"
    ftype = ", ".join(decl.argtypes) or "void"
    if decl.restype == "void":
        unbound, body = "return;", f"{call};"
    else:
        # unbound means the process is exiting: a release then succeeds without freeing
        # (the process's memory goes with it), since AOTI throws on a failed delete inside
        # destructors, where a throw is std::terminate
        fail = "1" if decl.returns_error and not _releases(n) else "0"
        unbound, body = f"return ({decl.restype}){fail};", f"return {call};"
    # per-shim counts: index is this shim's row of etm_shim_native / etm_shim_python
    return (
        f"typedef {decl.restype} (*etm_fn_{n})({ftype});\n"
        f"ETM_EXPORT etm_fn_{n} etm_fp_{n} = nullptr;\n"
        f"#define ETM_SHIM_ROW {index}\n"
        f"ETM_EXPORT {decl.restype} {n}({_params(decl)}) {{\n"
        f"{_native_path(decl, device_paths)}"
        f"  ETM_HIT_PYTHON();\n"
        f"  etm_fn_{n} f = etm_fp_{n};\n"
        f'  if (!f) {{ etm_last_unbound = "{n}"; {unbound} }}\n'
        f"  {body}\n}}\n"
        "#undef ETM_SHIM_ROW\n"
    )


def _constant(decl: abi.Decl, value: int) -> str:
    suffix = "ULL" if decl.restype == "uint64_t" else ""
    return f"ETM_EXPORT {decl.restype} {decl.name}(void) {{ return {value}{suffix}; }}\n"


_HEADER = (
    "// generated by etmetal.shims.bridge; do not edit\n"
    "#include <cstdint>\n#include <cstddef>\n#include <cstdio>\n#include <stdexcept>\n"
    "#include <string>\n"
    '#include "native_tensors.h"\n'
    '#include "native_fallbacks.h"\n'
    '#include "proxy_host.h"\n'
)

_GLOBALS = """ETM_EXPORT uint64_t etm_calls = 0;
ETM_EXPORT const char* etm_last_unbound = nullptr;
ETM_EXPORT char etm_check_message[1024] = {0};
ETM_EXPORT bool etm_grad_enabled = false;
// a count is a relaxed atomic add: shims called concurrently (outside a model run, which
// holds its context's run lock) each count, and no order with other memory is needed
#define ETM_BUMP(x) __atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED)
#define ETM_HIT_NATIVE() (ETM_BUMP(etm_calls), ETM_BUMP(etm_shim_native[ETM_SHIM_ROW]))
#define ETM_HIT_PYTHON() (ETM_BUMP(etm_calls), ETM_BUMP(etm_shim_python[ETM_SHIM_ROW]))
"""


def _counters(n: int) -> str:
    """Per forwarded shim (in ``forwarded_decls`` order): calls served in C, calls that
    went to Python (``Bridge.shim_counts``)."""
    rows = max(n, 1)
    return (
        f"ETM_EXPORT int64_t etm_shim_rows = {n};\n"
        f"ETM_EXPORT uint64_t etm_shim_native[{rows}] = {{0}};\n"
        f"ETM_EXPORT uint64_t etm_shim_python[{rows}] = {{0}};\n"
    )


_CHECK = """ETM_EXPORT void aoti_torch_check(bool cond, const char* func, const char* file, uint32_t line,
                                 const char* msg) {
  if (cond) return;
  __atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED);
  std::string m = std::string("check failed in ") + (func ? func : "?") + " at " +
                  (file ? file : "?") + ":" + std::to_string(line) + ": " + (msg ? msg : "");
  std::snprintf(etm_check_message, sizeof(etm_check_message), "%s", m.c_str());
  throw std::runtime_error(m);
}
"""


def forwarded_decls(shims: Mapping[str, Callable]) -> list[abi.Decl]:
    decls = abi.declarations()
    missing = sorted(n for n in shims if n not in decls)
    if missing:
        raise BridgeError(f"shims without a C declaration in torch's headers: {missing}")
    return [decls[n] for n in sorted(shims)]


def generate_source(shims: Mapping[str, Callable], sources: Sequence[BridgeSource] = ()) -> str:
    """The trampoline's C++ source for every constant shim and every shim in ``shims``, with
    the native code of the devices' ``sources``."""
    decls = abi.declarations()
    device_paths: dict[str, str] = {}
    for source in sources:
        device_paths.update(source.native_paths)
    forwarded = forwarded_decls(shims)
    parts = [
        _HEADER,
        *(s.includes for s in sources),
        'extern "C" {\n',
        _GLOBALS,
        _counters(len(forwarded)),
        _CHECK,
        *(s.code for s in sources),
    ]
    for name, value in sorted(constant_shims().items()):
        if name in decls and name not in shims:
            parts.append(_constant(decls[name], value))
    parts.extend(_forwarder(d, device_paths, i) for i, d in enumerate(forwarded))
    parts.append('}  // extern "C"\n')
    return "".join(parts)


def build(source: str) -> Path:
    """Compile the trampoline if the cache has no build of this exact source; return its path."""
    try:
        units = (*native_tensors.SOURCES, *native_fallbacks.SOURCES, native_custom_ops.SOURCE)
        headers = (native_tensors.HEADER, native_tensors.RECORDS_HEADER, native_fallbacks.HEADER)
        files = {
            "libetmetal_bridge.cpp": source.encode(),
            **{p.name: p.read_bytes() for p in (*units, *headers, int4_kernel.SOURCE)},
            **fallback_codegen.files(),
            **proxy_native.host_files(),
        }
        compiled = [
            "libetmetal_bridge.cpp",
            *(p.name for p in units),
            proxy_native.HOST_SOURCE.name,
        ]
        return build_files(
            "bridge",
            "libetmetal_bridge.so",
            files,
            compiled,
            lang="c++",
            flags=("-O2", "-std=c++17", *WARNINGS),
        )
    except NativeBuildError as exc:
        raise BridgeError(f"the shim trampoline: {exc}") from exc


def _guard(name: str, fn, decl: abi.Decl, ctx: ShimContext):
    """Wrap ``fn`` so no exception ever crosses into C: failures become return codes, the
    message goes to ``ctx``. Generated with the exact arity (no ``*args`` packing) and
    ``ctx`` bound in its scope: this frame runs on every call.
    """
    params = ", ".join(f"a{i}" for i in range(len(decl.argtypes)))
    args = ", ".join(["ctx", *(f"a{i}" for i in range(len(decl.argtypes)))])
    if decl.returns_error:
        ok, fail = f"impl({args})\n        return 0", "return 1"
    elif decl.restype == "void":
        ok, fail = f"impl({args})", "return None"
    else:
        ok, fail = f"return impl({args})", "return 0"
    src = (
        f"def {name}({params}):\n"
        f"    try:\n        {ok}\n"
        f"    except BaseException as exc:  # C callers cannot take exceptions\n"
        f"        fail(name, str(exc) if exc.args else type(exc).__name__)\n        {fail}\n"
    )
    scope = {"impl": fn, "ctx": ctx, "fail": ctx.record_error, "name": name}
    exec(compile(src, f"<etmetal shim {name}>", "exec"), scope)
    return scope[name]


class Bridge:
    """The loaded trampoline with the Python callbacks of one context bound."""

    def __init__(self, path: Path, ctx: ShimContext) -> None:
        self.path = path
        self.context = ctx
        try:
            # PyDLL: calls from Python keep the GIL, so the native shims' allocator and slot
            # ring are never entered by two threads at once, and etm_run's callbacks need
            # not re-take it
            self.lib = ctypes.PyDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise BridgeError(f"loading the shim trampoline {path} failed: {exc}") from exc
        self._calls = ctypes.c_uint64.in_dll(self.lib, "etm_calls")
        self.counter = self._calls  # ``counter.value``: ``calls`` without the property call
        # strong references: C holds raw pointers to these
        self._callbacks: dict[str, ctypes._CFuncPtr] = {}
        self.forwarded: dict[str, abi.Decl] = {}
        for decl in forwarded_decls(ctx.shims):
            self.forwarded[decl.name] = decl
            self.bind(decl.name, ctx.shims[decl.name])
        # static destructors of loaded models run after the interpreter is gone (the Metal
        # wrapper deletes its shader libraries then): from exit on, shims answer "unbound"
        # in C instead of calling into a finalized Python
        # (through a weak reference: the exit hook must not keep a context's bridge alive)
        atexit.register(_unbind_at_exit, weakref.ref(self))
        self.constants = {n: v for n, v in constant_shims().items() if hasattr(self.lib, n)}
        self.exported = (
            frozenset(self.forwarded)
            | frozenset(self.constants)
            | {CHECK_SHIM}
            | frozenset().union(*(s.native_only for s in ctx.bridge_sources()))
        )
        self._functions: dict[str, ctypes._CFuncPtr] = {}
        count = ctypes.c_int64.in_dll(self.lib, "etm_nrec").value
        python_half = ctypes.c_int64.in_dll(self.lib, "etm_npy").value
        size = native_tensors.RECORD_SIZE
        recs = (ctypes.c_char * (count * size)).in_dll(self.lib, "etm_recs")
        self._records_memory = recs  # keep the ctypes view alive with the bridge
        # touch every record page now: handles cycle through the whole table (FIFO reuse),
        # and resident memory should not creep up over the first thousands of runs
        ctypes.memset(ctypes.addressof(recs), 0, ctypes.sizeof(recs))
        base = ctypes.addressof(recs)
        native = native_tensors.NativeTensors(self.lib, base)
        rows = ctypes.c_int64.in_dll(self.lib, "etm_shim_rows").value
        if rows != len(self.forwarded):
            raise BridgeError(
                f"{path.name} counts {rows} shims, the context forwards {len(self.forwarded)}"
            )
        self._shim_native = (ctypes.c_uint64 * max(rows, 1)).in_dll(self.lib, "etm_shim_native")
        self._shim_python = (ctypes.c_uint64 * max(rows, 1)).in_dll(self.lib, "etm_shim_python")
        try:  # libtorch's own C shims for the fallbacks served in C
            self.libtorch_functions = native_fallbacks.bind(self.lib)
            native_custom_ops.configure(self.lib)
        except native_fallbacks.NativeFallbackError as exc:
            raise BridgeError(f"the shim trampoline: {exc}") from exc
        ctx.attach_native(
            Records(base, memoryview(recs).cast("B"), python_half, count, native), native
        )

    def bind(self, name: str, fn: Callable) -> None:
        """Make the forwarded shim ``name`` call ``fn(ctx, *c_args)``."""
        decl = self.forwarded[name]
        proto = ctypes.CFUNCTYPE(decl.ctypes_restype(), *decl.ctypes_argtypes())
        cb = proto(_guard(name, fn, decl, self.context))
        slot = ctypes.c_void_p.in_dll(self.lib, f"etm_fp_{name}")
        slot.value = ctypes.cast(cb, ctypes.c_void_p).value
        self._callbacks[name] = cb  # after the slot points to it: the old one may go now

    def unbind(self) -> None:
        """Detach every Python shim: later calls fail with an error code, in C only."""
        for name in self.forwarded:
            ctypes.c_void_p.in_dll(self.lib, f"etm_fp_{name}").value = None
        # and libtorch: the fallbacks go to the (unbound) Python half, and a storage
        # libtorch made that is still held at exit is left to the process's end
        native_fallbacks.unbind(self.lib)

    def serve_proxy(self, handle: int, executor: proxy_native.NativeProxyExecutor | None) -> None:
        """Serve the proxy executor handle ``handle`` with the native ``executor`` (None:
        stop; its calls then go to the Python executor registered for it)."""
        if executor is not None:
            entry = ctypes.c_void_p.in_dll(self.lib, "etm_proxy_entry")
            entry.value = proxy_native.entry_address()
        bind = self.lib.etm_proxy_bind_on
        bind.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
        bind.restype = ctypes.c_int32
        if executor is None:
            bind(handle, None, 0)
        elif bind(handle, executor.address, executor.device_type) != 0:
            raise BridgeError(
                f"the native proxy executor cannot serve device {executor.device_type}"
            )

    def shim_counts(self) -> dict[str, tuple[int, int]]:
        """Shim name -> (calls served in C, calls that went to Python) since the load,
        for every forwarded shim called at least once."""
        native, python = self._shim_native, self._shim_python
        return {
            name: (native[i], python[i])
            for i, name in enumerate(self.forwarded)
            if native[i] or python[i]
        }

    @property
    def calls(self) -> int:
        """Shim calls that reached etmetal since the trampoline was loaded."""
        return self._calls.value

    def check_message(self) -> str:
        """The message of the last failed ``aoti_torch_check`` (kernel bounds checks)."""
        return ctypes.string_at(
            ctypes.addressof(ctypes.c_char.in_dll(self.lib, "etm_check_message"))
        ).decode(errors="replace")

    def shadowed(self, names) -> list[str]:
        """Those of ``names`` that the process's global scope defines (it is not etmetal).

        A model ``.so`` resolves its undefined symbols through the global scope before
        its wrapper's local group; if a library loaded RTLD_GLOBAL defines one, the
        ``.so`` would bind to it instead of etmetal.
        """
        scope = ctypes.CDLL(None)  # dlopen(NULL): the global lookup scope
        return sorted(n for n in names if hasattr(scope, n))

    def c_function(self, name: str) -> ctypes._CFuncPtr:
        """The exported C function ``name`` with its exact signature, callable from Python."""
        fn = self._functions.get(name)
        if fn is None:
            if name not in self.exported:
                raise BridgeError(f"{name} is not exported by the shim trampoline")
            decl = abi.declarations()[name]
            fn = getattr(self.lib, name)
            fn.restype = decl.ctypes_restype()
            fn.argtypes = decl.ctypes_argtypes()
            if name == CHECK_SHIM:
                fn = _python_safe_check(fn)
            self._functions[name] = fn
        return fn


def _python_safe_check(fn):
    """``aoti_torch_check(false)`` throws a C++ exception, which must not unwind into Python."""

    def check(cond, func, file, line, msg):
        if not cond:
            raise BridgeError(
                "aoti_torch_check(false, ...) throws std::runtime_error for its C++ caller; "
                "it cannot be called with a false condition from Python"
            )
        return fn(cond, func, file, line, msg)

    return check


class CApi:
    """``c_api().aoti_torch_empty_strided(...)``: a context's shims under their C names."""

    def __init__(self, ctx: ShimContext) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str):
        return self._ctx.load_bridge().c_function(name)
