"""The Metal half of the AOTI C-shim ABI: which ``aoti_torch_mps_*`` names are the
device runtime (``shim_mps.h``) and which are operator fallbacks (``c_shim_mps.h``).

A Metal ``.so`` calls both kinds under the same prefix. The runtime calls (memory,
shader libraries, argument encoding, dispatch, command blocks) appear in every model
that has a generated kernel or a constant; the fallbacks (``aoti_torch_mps_mm_out``,
...) are the operators Inductor did not generate, which the partitioner predicts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# every function torch 2.13's aoti_torch/c/shim_mps.h declares
MPS_RUNTIME_ABI: frozenset[str] = frozenset(
    {
        "aoti_torch_mps_malloc",
        "aoti_torch_mps_free",
        "aoti_torch_mps_memcpy",
        "aoti_torch_mps_copy_buffer",
        "aoti_torch_mps_create_shader_library",
        "aoti_torch_mps_delete_shader_library",
        "aoti_torch_mps_get_kernel_function",
        "aoti_torch_mps_start_encoding",
        "aoti_torch_mps_set_arg_tensor",
        "aoti_torch_mps_set_arg_int",
        "aoti_torch_mps_dispatch_single",
        "aoti_torch_mps_dispatch_single_with_group_size",
        "aoti_torch_mps_dispatch_array",
        "aoti_torch_mps_dispatch_array_with_group_size",
        "aoti_torch_mps_run_command_block",
        "aoti_torch_mps_shared_callback",
    }
)

_DEVICE_CALL = re.compile(r"\baoti_torch_(?:cpu|mps|cuda)_[A-Za-z0-9_]+")


def fallback_calls(names: Iterable[str]) -> set[str]:
    """The operator fallbacks among shim names (device-prefixed, runtime ABI excluded)."""
    return {n for n in names if _DEVICE_CALL.fullmatch(n) and n not in MPS_RUNTIME_ABI}


def fallback_calls_in_source(cpp_source: str) -> set[str]:
    """The operator fallbacks a generated wrapper ``.cpp`` calls (``name(`` in the code;
    the Metal kernel sources it carries contain no shim calls)."""
    called = re.findall(r"\b(aoti_torch_(?:cpu|mps|cuda)_[A-Za-z0-9_]+)\s*\(", cpp_source)
    return fallback_calls(called)
