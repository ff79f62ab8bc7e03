"""Build ``libetmetal_stock.so``: the MetalBackend for the stock runtime and the native shims.

The library is one content-addressed build (:mod:`etmetal.common.native_build`) of:

- the shim trampoline ``shims.bridge`` generates for etmetal's host shims, with
  ``shims/native_tensors.cpp`` and ``shims/native_fallbacks.cpp``: the same native layer
  etmetal's Python runtime uses, with every Python forwarder left unbound (a shim not
  served in C fails with its name);
- this folder's C++ units (``metal_backend.cpp`` and ``stock_*.cpp``);
- two generated includes: ``itemsizes.inc`` (c10 dtype code -> bytes, from
  ``shims.abi_codes``) and ``wrapper_template.inc``, the link-wrapper template
  (``stock_loader.cpp``): an empty shared object whose three DT_NEEDED are placeholder
  paths, linked once here against three empty objects with those names as their
  sonames, and embedded as bytes, so loading a delegate needs no compiler.

It links the executorch wheel's ``libexecutorch.so`` (where ``register_backend`` lives),
libcrypto (sha256) and libdl; a Python-free runner links the library the same way.
"""

from __future__ import annotations

from pathlib import Path

from etmetal.common.native_build import WARNINGS, NativeBuildError, build_files, build_shared
from etmetal.shims import (
    abi_codes,
    bridge,
    fallback_codegen,
    int4_kernel,
    native_fallbacks,
    native_tensors,
    proxy_native,
)
from etmetal.shims.device import BridgeSource
from etmetal.shims.standard_context import standard_shims

HERE = Path(__file__).parent
SOURCES = (
    "metal_backend.cpp",
    "stock_custom_ops.cpp",
    "stock_constants.cpp",
    "stock_index.cpp",
    "stock_loader.cpp",
    "stock_proxy.cpp",
    "stock_tensors.cpp",
    "stock_trust.cpp",
)
HEADERS = (
    "etmetal_stock.h",
    "stock_backend.h",
    "stock_constants.h",
    "stock_custom_ops.h",
    "stock_events.h",
    "stock_proxy.h",
    "stock_tensors.h",
)
# the C API a program linking the library calls (etm_stock_configure, ...)
PUBLIC_HEADER = HERE / "etmetal_stock.h"
LIB_NAME = "libetmetal_stock.so"
# placeholder DT_NEEDED paths of the link-wrapper template, patched per delegate; each
# path written over one must be shorter
PLACEHOLDER_BYTES = 1024
PLACEHOLDERS = {
    "BRIDGE": "/etmetal-placeholder-bridge/",
    "VECMATH": "/etmetal-placeholder-vecmath/",
    "MODEL": "/etmetal-placeholder-model/",
}


def _served(call: str) -> str:
    # 0 served, 1 refused with a message (etm_check_message), -1 left to the unbound Python
    return f"  {{ int r = {call}; if (r >= 0) {{ ETM_HIT_NATIVE(); return r; }} }}\n"


# the custom operators' shims, which etmetal's Python runtime serves in Python
_CUSTOM_OP_PATHS = {
    "aoti_torch_cpu__linear_fp_act_4bit_weight": _served(
        "etm_stock_int4_linear(a0, a1, a2, a3, a4, (void**)a5)"
    ),
    "aoti_torch_cpu_gather_qmv": _served(
        "etm_stock_gather_qmv(a0, a1, a2, a3, a4, a5, (void**)a6)"
    ),
    "aoti_torch_cpu_gated_delta_rule": _served(
        "etm_stock_gated_delta_rule(a0, a1, a2, a3, a4, a5, (void**)a6)"
    ),
    # the extern-node table's operators, run by the proxy library (stock_proxy.cpp)
    proxy_native.PROXY_SHIM: _served(
        "etm_stock_proxy_call(a0, a1, a2, (const int64_t*)a3, a4, (void* const*)a5)"
    ),
}
# shims that are not operators: no event of their own
_NOT_OPERATORS = ("create_tensor_from_blob", "new_tensor_handle")


def _with_event(name: str, path: str) -> str:
    """``path`` inside an event-tracer event named after the shim (stock_events.h)."""
    return f'  EtmFallbackEvent etm_event_("{name}");\n{path}'


# each fallback and custom operator is an event of the execute's ETDump
FALLBACK_PATHS = {
    name: _with_event(name, path)
    for name, path in {**native_fallbacks.NATIVE_PATHS, **_CUSTOM_OP_PATHS}.items()
    if not any(word in name for word in _NOT_OPERATORS) and name not in fallback_codegen.UTILITIES
}
CUSTOM_OPS = BridgeSource(
    includes='#include "stock_custom_ops.h"\n#include "stock_events.h"\n#include "stock_proxy.h"\n',
    native_paths=FALLBACK_PATHS,
)


class StockBuildError(RuntimeError):
    """The stock-runtime library could not be built."""


def executorch_dir() -> Path:
    """The executorch wheel's folder (its ``include/`` and ``lib/``)."""
    import executorch

    return Path(next(iter(executorch.__path__)))


def _placeholder(name: str) -> str:
    head = PLACEHOLDERS[name]
    return head + "x" * (PLACEHOLDER_BYTES - len(head))


def wrapper_template() -> bytes:
    """The link-wrapper template: DT_NEEDED = the three placeholders, in order."""
    stubs = []
    for name in PLACEHOLDERS:
        stubs.append(
            build_shared(
                "stock-placeholders",
                f"lib{name.lower()}.so",
                f"/* stands for the {name.lower()} of a delegate's link group */\n",
                link=(f"-Wl,-soname,{_placeholder(name)}",),
            )
        )
    template = build_shared(
        "stock-wrapper",
        "libetmetal_link.so",
        "/* generated by etmetal.stock_runtime.build: a link group, no code */\n",
        link=("-Wl,--no-as-needed", *map(str, stubs)),
    )
    data = template.read_bytes()
    for name in PLACEHOLDERS:
        if data.count(_placeholder(name).encode()) != 1:
            raise StockBuildError(f"the link-wrapper template does not name the {name} once")
    return data


def _template_include(data: bytes) -> bytes:
    rows = [", ".join(str(b) for b in data[i : i + 32]) for i in range(0, len(data), 32)]
    lines = ["// generated by etmetal.stock_runtime.build; do not edit"]
    for name in PLACEHOLDERS:
        lines.append(f'#define ETM_PLACEHOLDER_{name} "{_placeholder(name)}"')
    lines.append("static const unsigned char etm_wrapper_template[] = {")
    lines.extend(f"    {row}," for row in rows)
    lines.append("};")
    lines.append(f"static const size_t etm_wrapper_template_len = {len(data)};")
    return ("\n".join(lines) + "\n").encode()


def _itemsize_include() -> bytes:
    rows = ", ".join(f"{{{code}, {size}}}" for code, size in sorted(abi_codes.ITEMSIZE.items()))
    return (
        "// generated by etmetal.stock_runtime.build from etmetal.shims.abi_codes.ITEMSIZE\n"
        f"static const int etm_stock_itemsizes[][2] = {{{rows}}};\n"
    ).encode()


def build_library() -> Path:
    """Build the library unless the cache has this exact build; its verified path."""
    et = executorch_dir()
    files = {
        "libetmetal_bridge.cpp": bridge.generate_source(standard_shims(), [CUSTOM_OPS]).encode(),
        int4_kernel.SOURCE.name: int4_kernel.SOURCE.read_bytes(),
        native_tensors.SOURCE.name: native_tensors.SOURCE.read_bytes(),
        native_tensors.HEADER.name: native_tensors.HEADER.read_bytes(),
        native_fallbacks.SOURCE.name: native_fallbacks.SOURCE.read_bytes(),
        native_fallbacks.HEADER.name: native_fallbacks.HEADER.read_bytes(),
        **fallback_codegen.files(),
        **proxy_native.host_files(),
        **proxy_native.json_reader_files(),
        "itemsizes.inc": _itemsize_include(),
        **{name: (HERE / name).read_bytes() for name in (*SOURCES, *HEADERS)},
    }
    try:
        files["wrapper_template.inc"] = _template_include(wrapper_template())
        return build_files(
            "stock-runtime",
            LIB_NAME,
            files,
            [
                "libetmetal_bridge.cpp",
                native_tensors.SOURCE.name,
                native_fallbacks.SOURCE.name,
                proxy_native.HOST_SOURCE.name,
                proxy_native.JSON_READER.name,
                *SOURCES,
            ],
            lang="c++",
            flags=(
                "-O2",
                "-std=c++17",
                *WARNINGS,
                "-isystem",
                str(et / "include"),
                # the c10 headers ExecuTorch's portable types include
                "-isystem",
                str(et / "include/executorch/runtime/core/portable_type/c10"),
                "-DC10_USING_CUSTOM_GENERATED_MACROS",
                "-DET_EVENT_TRACER_ENABLED",
            ),
            link=(
                f"-L{et / 'lib'}",
                "-lexecutorch",
                f"-Wl,-rpath,{et / 'lib'}",
                "-lcrypto",
                "-ldl",
            ),
        )
    except NativeBuildError as exc:
        raise StockBuildError(f"building {LIB_NAME}: {exc}") from exc
