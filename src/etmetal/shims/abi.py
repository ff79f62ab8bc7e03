"""C declarations of the ``aoti_torch_*`` ABI, read from the headers torch installs.

The bridge needs each symbol's exact C signature (some take ``double`` or return
``bool``/``size_t``, so one generic forwarder cannot serve all of them). Types are
reduced to what matters for the calling convention: every pointer or handle is
``void*``; scalars keep their C type.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from dataclasses import dataclass

import torch

from etmetal.common import custom_ops

HEADERS = (
    "c/shim.h",
    "c/shim_deprecated.h",
    "c/shim_cpu.h",
    "c/shim_mps.h",
    "generated/c_shim_cpu.h",
    "generated/c_shim_mps.h",
    "generated/c_shim_aten.h",
)

# C scalar type -> ctypes type (pointers and handles are all void*)
SCALARS: dict[str, type | None] = {
    "void": None,
    "bool": ctypes.c_bool,
    "int": ctypes.c_int,
    "int8_t": ctypes.c_int8,
    "int16_t": ctypes.c_int16,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "AOTITorchError": ctypes.c_int32,
    "StableIValue": ctypes.c_uint64,
    "unsigned": ctypes.c_uint32,
    "unsigned int": ctypes.c_uint32,
}
C_SPELLING = {
    "AOTITorchError": "int32_t",
    "StableIValue": "uint64_t",
    "unsigned": "uint32_t",
    "unsigned int": "uint32_t",
}
# typedef'd function-pointer types the headers pass (passed like any pointer)
POINTER_TYPEDEFS = frozenset({"aoti_torch_mps_command_block_callback_t"})

_DECL = re.compile(r"AOTI_TORCH_EXPORT\s+([\w:<>\s\*]+?)\s*\b(aoti_\w+)\s*\((.*?)\)\s*;", re.S)


@dataclass(frozen=True)
class Decl:
    """One C function: ``restype name(argtypes...)`` with pointers as ``void*``."""

    name: str
    restype: str  # C spelling: "int32_t", "void*", "void", "double", ...
    argtypes: tuple[str, ...]
    # declared as returning AOTITorchError (0 = success, 1 = failure)
    returns_error: bool = False

    def ctypes_restype(self):
        return ctypes.c_void_p if self.restype == "void*" else SCALARS[self.restype]

    def ctypes_argtypes(self) -> list:
        return [ctypes.c_void_p if a == "void*" else SCALARS[a] for a in self.argtypes]


def include_dir() -> str:
    return os.path.join(
        os.path.dirname(torch.__file__), "include", "torch", "csrc", "inductor", "aoti_torch"
    )


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _c_type(spelled: str) -> str | None:
    """Reduce a C/C++ type to its calling-convention class, or None if unsupported."""
    t = re.sub(r"\bconst\b", " ", spelled).strip()
    if "*" in t or t.endswith("Handle") or t in POINTER_TYPEDEFS:
        return "void*"
    t = " ".join(t.split())
    if t in SCALARS:
        return C_SPELLING.get(t, t)
    return None  # e.g. c10::complex<float> passed by value


def _param_type(param: str) -> str | None:
    param = param.strip()
    if "(" in param:  # a function-pointer parameter
        return None
    # drop the parameter's name (the trailing identifier), if it has one
    m = re.match(r"^(.*?[\w\*>&])\s*\b([A-Za-z_]\w*)$", param)
    spelled = m.group(1) if m and m.group(1).strip() not in ("", "const") else param
    return _c_type(spelled)


def _param_name(param: str) -> tuple[str, str]:
    """(type as spelled, name) of one parameter; name "" when the header gives none."""
    param = " ".join(param.split())
    m = re.match(r"^(.*?[\w\*>&])\s*\b([A-Za-z_]\w*)$", param)
    if m and m.group(1).strip() not in ("", "const") and _c_type(m.group(1)) is not None:
        return m.group(1).strip(), m.group(2)
    return param, ""


def _header_functions():
    """(return type as spelled, name, parameters as spelled) of every function torch's AOTI
    shim headers declare, in header order."""
    root = include_dir()
    for rel in HEADERS:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = _strip(f.read())
        for m in _DECL.finditer(text):
            ret_spelled, name, params = m.groups()
            params = params.strip()
            yield ret_spelled, name, [] if params in ("", "void") else params.split(",")


@functools.lru_cache(maxsize=1)
def parameters() -> dict[str, tuple[tuple[str, str], ...]]:
    """name -> each parameter's (type as spelled, name), for every function of
    :func:`declarations` torch's headers declare: the roles the generated fallbacks give
    arguments (tensor, optional, list, output) come from these spellings and names."""
    found: dict[str, tuple[tuple[str, str], ...]] = {}
    for _, name, plist in _header_functions():
        found.setdefault(name, tuple(_param_name(p) for p in plist))
    return {name: found[name] for name in declarations() if name in found}


@functools.lru_cache(maxsize=1)  # torch's headers are fixed for the process: one parse
def declarations() -> dict[str, Decl]:
    """Every function in torch's AOTI shim headers that a trampoline can forward."""
    decls: dict[str, Decl] = {}
    for ret_spelled, name, plist in _header_functions():
        restype = _c_type(ret_spelled)
        args = [_param_type(p) for p in plist]
        if restype is None or any(a is None for a in args):
            continue
        error = ret_spelled.strip() == "AOTITorchError"
        decls.setdefault(name, Decl(name, restype, tuple(args), error))
    # the custom operators' shims (torchao, metal::*), declared by etmetal, not torch
    custom = "".join(f"AOTI_TORCH_EXPORT {d};\n" for d in custom_ops.declarations())
    for m in _DECL.finditer(custom):
        ret_spelled, name, params = m.groups()
        args = tuple(_param_type(p) for p in params.split(","))
        decls.setdefault(name, Decl(name, "int32_t", args, True))
    return decls
