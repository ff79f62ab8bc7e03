"""The integer codes the AOTI ABI uses for dtypes, devices, layouts and memory formats.

They are c10's enum values (``c10::ScalarType``, ``c10::DeviceType``, ...), which the
compiled ``.so`` obtains by calling ``aoti_torch_dtype_float32()`` and friends; the
bridge bakes these values into those functions.
"""

from __future__ import annotations

import torch

from etmetal.common.scalar_types import QUANTIZED_OR_BITS, SCALAR_TYPE_CODES
from etmetal.common.targets import CPU_DEVICE, METAL_DEVICE

# c10::ScalarType codes the AOTI ABI exposes (one ``aoti_torch_dtype_<name>`` each)
DTYPE_CODES: dict[str, int] = {
    n: code for n, code in SCALAR_TYPE_CODES.items() if n not in QUANTIZED_OR_BITS
}

# dtypes a shim tensor may have (complex32 / float4 have no usable ATen kernels on CPU)
_TENSOR_DTYPES = [n for n in DTYPE_CODES if n not in ("complex32", "float4_e2m1fn_x2")]
DTYPE_TO_TORCH: dict[int, torch.dtype] = {
    DTYPE_CODES[n]: getattr(torch, n) for n in _TENSOR_DTYPES if hasattr(torch, n)
}
TORCH_TO_DTYPE: dict[torch.dtype, int] = {v: k for k, v in DTYPE_TO_TORCH.items()}
ITEMSIZE: dict[int, int] = {k: v.itemsize for k, v in DTYPE_TO_TORCH.items()}

# c10::DeviceType
DEVICE_CODES: dict[str, int] = {
    CPU_DEVICE: 0,
    "cuda": 1,
    "xpu": 12,
    METAL_DEVICE: 13,
    "meta": 14,
    "privateuse1": 20,
}
DEVICE_CPU = DEVICE_CODES[CPU_DEVICE]
DEVICE_MPS = DEVICE_CODES[METAL_DEVICE]  # c10::DeviceType::MPS


def _numbered(*names: str) -> dict[str, int]:
    """name -> code of a c10 enum that numbers its members 0, 1, ... in declaration order."""
    return {name: code for code, name in enumerate(names)}


# c10::Layout
LAYOUT_CODES = _numbered(
    "strided", "sparse_coo", "sparse_csr", "_mkldnn", "sparse_csc", "sparse_bsr", "sparse_bsc",
    "jagged",
)  # fmt: skip
LAYOUT_STRIDED = LAYOUT_CODES["strided"]

# c10::MemoryFormat
MEMORY_FORMAT_CODES = _numbered(
    "contiguous_format", "preserve_format", "channels_last", "channels_last_3d"
)

# the shims that just return a code: aoti_torch_<kind>_<name>
_CONSTANT_TABLES = {
    "dtype": DTYPE_CODES,
    "device_type": DEVICE_CODES,
    "layout": LAYOUT_CODES,
    "memory_format": MEMORY_FORMAT_CODES,
}


def abi_version() -> int:
    """TORCH_ABI_VERSION of the installed torch: major << 56 | minor << 48."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major << 56) | (minor << 48)


def constant_shims() -> dict[str, int]:
    """Every shim that just returns a code, with its value."""
    out = {
        f"aoti_torch_{kind}_{name}": code
        for kind, table in _CONSTANT_TABLES.items()
        for name, code in table.items()
    }
    out["aoti_torch_abi_version"] = abi_version()
    return out
