"""The native source the bridge compiles in for the emulated Metal device (``bridge_source.cpp``)."""

from __future__ import annotations

from pathlib import Path

INCLUDES = "#include <functional>\n"

# shims declared in torch's headers that the bridge defines natively, with no Python half
NATIVE_ONLY = frozenset({"aoti_torch_mps_shared_callback"})

# forwarders whose body is native: Python's shim (the etm_fp_ pointer) validates first
NATIVE_PATHS = {
    "aoti_torch_mps_run_command_block": (
        "  return etm_mps_run_command_block(a0, a1, a2, etm_fp_aoti_torch_mps_run_command_block);\n"
    ),
}


def c_source() -> str:
    return (Path(__file__).parent / "bridge_source.cpp").read_text()
