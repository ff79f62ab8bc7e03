"""The c10 scalar type table: dtype name -> ``c10::ScalarType`` code.

ExecuTorch serializes a tensor's dtype with the same numbering (``ScalarType`` in its
program schema) and the AOTI C ABI hands these codes to a compiled ``.so``
(``aoti_torch_dtype_float32()`` and friends), so the runtime and the shims read one
table. Names are ``torch`` attribute names; the table holds no torch objects so that
importing it costs nothing.
"""

from __future__ import annotations

SCALAR_TYPE_CODES: dict[str, int] = {
    "uint8": 0,
    "int8": 1,
    "int16": 2,
    "int32": 3,
    "int64": 4,
    "float16": 5,
    "float32": 6,
    "float64": 7,
    "complex32": 8,
    "complex64": 9,
    "complex128": 10,
    "bool": 11,
    "qint8": 12,
    "quint8": 13,
    "qint32": 14,
    "bfloat16": 15,
    "quint4x2": 16,
    "quint2x4": 17,
    "bits16": 22,
    "float8_e5m2": 23,
    "float8_e4m3fn": 24,
    "float8_e5m2fnuz": 25,
    "float8_e4m3fnuz": 26,
    "uint16": 27,
    "uint32": 28,
    "uint64": 29,
    "float8_e8m0fnu": 44,
    "float4_e2m1fn_x2": 45,
}

# the quantized and raw-bits types: programs may carry them, the AOTI C ABI has no
# ``aoti_torch_dtype_*`` for them
QUANTIZED_OR_BITS: frozenset[str] = frozenset(
    {"qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits16"}
)
