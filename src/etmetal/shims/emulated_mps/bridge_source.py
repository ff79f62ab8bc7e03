"""The native source the bridge compiles in for the emulated Metal device.

``bridge_source.cpp``: the command-block callback (the C++ ``std::function`` never reaches
Python). ``mps_encoder.cpp``: the launch path (functions, encoders, arguments, dispatch into
the MSL executor) served in C for the functions Python registered when they were fetched.
``mps_buffers.cpp``: ``mps_malloc``/``free`` and the copies between those buffers.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from etmetal.common.fallback_table import all_fallback_shims
from etmetal.shims import abi, native_fallbacks
from etmetal.shims.fallback_shims import mps_conv_memory_format

HERE = Path(__file__).parent
SOURCES = (
    HERE / "bridge_source.cpp",
    HERE / "mps_encoder.cpp",
    HERE / "mps_buffers.cpp",
    HERE / "mps_fallbacks.cpp",
)

INCLUDES = (
    "#include <cstdarg>\n#include <cstdlib>\n#include <cstring>\n#include <functional>\n"
    "#include <map>\n#include <unordered_map>\n"
)

# shims declared in torch's headers that the bridge defines natively, with no Python half
NATIVE_ONLY = frozenset({"aoti_torch_mps_shared_callback"})


def _served(call: str) -> str:
    """A body served in C for a function the native table knows; other handles (and every
    call while the native path is off) go on to Python's shim."""
    return (
        "  { etm_mps_fn* f = etm_mps_fn_of(a0);\n"
        f"    if (f) {{ ETM_HIT_NATIVE(); return {call}; }} }}\n"
    )


def _single(shim: str, group: str) -> str:
    return _served(f'etm_mps_dispatch_single(f, "aoti_torch_mps_{shim}", "{shim}", a1, {group})')


def _array(shim: str, group: str) -> str:
    return _served(f'etm_mps_dispatch_array(f, "aoti_torch_mps_{shim}", "{shim}", a1, a2, {group})')


def _buffers(call: str) -> str:
    return f"  {{ int32_t rc = 1; if ({call}) {{ ETM_HIT_NATIVE(); return rc; }} }}\n"


# forwarded shim -> the C body that runs first (bridge._native_path)
NATIVE_PATHS = {
    "aoti_torch_mps_malloc": _buffers("etm_mps_malloc((void**)a0, a1, &rc)"),
    "aoti_torch_mps_free": _buffers("etm_mps_free(a0, &rc)"),
    # memcpy(buffer, constant_offset, bytes_read, data_size, constants_start)
    "aoti_torch_mps_memcpy": _buffers("etm_mps_copy(a0, a1, a4, a2, a3, &rc)"),
    # copy_buffer(src, dst, data_size, src_offset, dst_offset)
    "aoti_torch_mps_copy_buffer": _buffers("etm_mps_copy(a1, a4, a0, a3, a2, &rc)"),
    "aoti_torch_mps_start_encoding": _served("etm_mps_start_encoding(f)"),
    "aoti_torch_mps_set_arg_tensor": _served("etm_mps_set_arg_tensor(f, a1, a2)"),
    "aoti_torch_mps_set_arg_int": _served("etm_mps_set_arg_int(f, a1, a2)"),
    "aoti_torch_mps_dispatch_single": _single("dispatch_single", "0"),
    "aoti_torch_mps_dispatch_single_with_group_size": _single(
        "dispatch_single_with_group_size", "a2"
    ),
    "aoti_torch_mps_dispatch_array": _array("dispatch_array", "nullptr, 0"),
    "aoti_torch_mps_dispatch_array_with_group_size": _array(
        "dispatch_array_with_group_size", "a3, a4"
    ),
    # a known function: the callback runs at once; otherwise Python validates the handle
    "aoti_torch_mps_run_command_block": _served("etm_mps_run_block(f, a0, a1, a2)")
    + "  ETM_HIT_PYTHON();\n"
    "  return etm_mps_run_command_block(a0, a1, a2, etm_fp_aoti_torch_mps_run_command_block);\n",
}


def _on_mps(host_path: str) -> str:
    """A host fallback's native path run on the records of the emulated Metal device."""
    return f"  {{ etm_fb_scope etm_scope_(ETM_DEVICE_MPS);\n    if (etm_scope_.on()) {{\n{host_path}    }} }}\n"


def _fallback_paths() -> dict[str, str]:
    """``aoti_torch_mps_<op>`` -> its native path: the host path of ``aoti_torch_cpu_<op>``
    on mps records where the two take the same arguments; the math attention and the
    convolution (its layout) have their own (``mps_fallbacks.cpp``); the custom operators
    are ``native_custom_ops``' (both devices)."""
    decls = abi.declarations()
    paths = {}
    for name in all_fallback_shims():
        if not name.startswith("aoti_torch_mps_"):
            continue
        host = "aoti_torch_cpu_" + name.removeprefix("aoti_torch_mps_")
        path = native_fallbacks.NATIVE_PATHS.get(host)
        if path is not None and host in decls and decls[host].argtypes == decls[name].argtypes:
            paths[name] = _on_mps(path)
    sdpa = "aoti_torch_mps__scaled_dot_product_attention_math_for_mps"
    paths[sdpa] = native_fallbacks.served(
        "etm_mps_sdpa_math(a0, a1, a2, a3, a4, a5, a6, a7, 0, a8, a9)"
    )
    paths[sdpa + "_v2"] = native_fallbacks.served(
        "etm_mps_sdpa_math(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10)"
    )
    paths["aoti_torch_mps_convolution"] = native_fallbacks.served(
        "etm_mps_convolution(a0, a1, a2, (const int64_t*)a3, a4, (const int64_t*)a5, a6, "
        "(const int64_t*)a7, a8, a9, (const int64_t*)a10, a11, a12, a13)"
    )
    return paths


NATIVE_PATHS.update(_fallback_paths())


def attach(ctx) -> None:
    """Tell the loaded bridge of ``ctx`` the layout torch's mps convolution rule gives each
    pair of input and weight layouts (``etm_mps_conv_rule``, mps_fallbacks.cpp)."""
    lib = ctx.native.lib
    table = (ctypes.c_int64 * 4).in_dll(lib, "etm_mps_conv_rule")
    layouts = (torch.contiguous_format, torch.channels_last)
    for xl, x_format in enumerate(layouts):
        for wl, w_format in enumerate(layouts):
            x = torch.empty(1, 2, 3, 3).contiguous(memory_format=x_format)
            w = torch.empty(2, 2, 2, 2).contiguous(memory_format=w_format)
            rule = mps_conv_memory_format(x, w)
            table[xl * 2 + wl] = layouts.index(rule) if rule in layouts else -1


def c_source() -> str:
    return "".join(path.read_text() for path in SOURCES)
