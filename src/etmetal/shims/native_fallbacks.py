"""The common CPU fallbacks and the constants served in C, with no Python call.

A fallback such as ``aoti_torch_cpu_mm_out`` is the one place a decode step of an LM must
leave generated code for ATen. Served in Python it costs a callback, an adoption of
every native buffer it touches (which then makes their views and deletes Python's
too) and several ATen views per call. Served here, the bridge wraps each record's memory
as a libtorch tensor with libtorch's own exported ``aoti_torch_create_tensor_from_blob``
(no copy), calls libtorch's own exported ``aoti_torch_cpu_<op>`` and deletes the
wrappers: the same kernel the Python shim reaches through ``torch.mm``, with no Python.

Nothing is compiled against libtorch: ``native_fallbacks.cpp`` lists each function it
calls with the signature it calls it with (``etm_lt_table``); at load, :func:`bind`
checks each signature against torch's installed headers (``abi``, the same
declarations the trampoline is generated from) and fills the slot with the address
``dlsym`` finds in the ``libtorch_cpu`` torch has already loaded.

C serves only what it is sure of: host records with elements, one dtype, the shapes the
op needs and a dense ``out`` (one with holes keeps Python's compute-then-scatter path).
Anything else, and any call libtorch fails, goes to the Python shim, which serves it or
reports the error by name. Out-variants write into memory the caller owns, so no new
tensor ever has to change hands between libtorch and etmetal.

Constants: while a container loads its constants (``AotiModel`` creating it),
``create_tensor_from_blob`` of host memory (one per weight of the blob) and
``new_tensor_handle`` of a native tensor (one per user-managed constant) make native
*borrowed* records, which never free their memory. So a weight's ``_reinterpret_tensor``
and ``delete_tensor_object`` stay in C as well (``native_tensors``). Outside that, these
two shims are Python's: a native borrowed record counts as one borrowed storage per
record (``memory_stats``), where Python's tensors of one blob share theirs.

All of it follows one switch, the implementation a model was loaded with
(``AotiModel(..., shims="native"|"python")``): the Python shims stay the reference.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from . import abi, fallback_codegen

NATIVE_DIR = Path(__file__).parent
SOURCE = NATIVE_DIR / "native_fallbacks.cpp"
HEADER = NATIVE_DIR / "native_fallbacks.h"
# the units: the hand-written fallbacks, and the generated ones with their loans
SOURCES = (SOURCE, NATIVE_DIR / "native_loans.cpp")

IMPLEMENTATIONS = ("native", "python")


class NativeFallbackError(RuntimeError):
    """libtorch's C shims cannot be bound as the bridge calls them."""


def check_implementation(shims: str) -> str:
    if shims not in IMPLEMENTATIONS:
        raise ValueError(f"shims must be one of {IMPLEMENTATIONS}, got {shims!r}")
    return shims


def served(call: str) -> str:
    # ETM_HIT_NATIVE() is defined per forwarder by the bridge generator (per-shim counts)
    return f"  if ({call}) {{ ETM_HIT_NATIVE(); return 0; }}\n"


# forwarded shim -> the C served before Python (bridge._native_path)
NATIVE_PATHS = {
    "aoti_torch_cpu_mm_out": served("etm_fb_mm_out(a0, a1, a2)"),
    "aoti_torch_cpu_bmm_out": served("etm_fb_bmm_out(a0, a1, a2)"),
    "aoti_torch_cpu_addmm_out": served("etm_fb_addmm_out(a0, a1, a2, a3, a4, a5)"),
    "aoti_torch_cpu_baddbmm_out": served("etm_fb_baddbmm_out(a0, a1, a2, a3, a4, a5)"),
    "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu": served(
        "etm_fb_sdpa_flash(a0, a1, a2, a3, a4, a5, a6, a7, a8)"
    ),
    "aoti_torch_cpu_convolution": served(
        "etm_fb_convolution(a0, a1, a2, (const int64_t*)a3, a4, (const int64_t*)a5, a6, "
        "(const int64_t*)a7, a8, a9, (const int64_t*)a10, a11, a12, a13)"
    ),
    "aoti_torch_cpu_topk": served("etm_fb_topk(a0, a1, a2, a3, a4, a5, a6)"),
    "aoti_torch_create_tensor_from_blob": served(
        "etm_native_borrow(a0, a1, (const int64_t*)a2, (const int64_t*)a3, a4, a5, a6, a7, "
        "(void**)a8)"
    ),
    # strided layout (0) and no opaque metadata only; the rest is Python's to refuse
    "aoti_torch_create_tensor_from_blob_v2": served(
        "a9 == 0 && a11 == 0 && etm_native_borrow(a0, a1, (const int64_t*)a2, "
        "(const int64_t*)a3, a4, a5, a6, a7, (void**)a8)"
    ),
    "aoti_torch_new_tensor_handle": served("etm_native_alias(a0, (void**)a1)"),
    # every other host fallback and the tensor utilities: generated from torch's headers
    **fallback_codegen.native_paths(),
}
# the libtorch tables of the bridge: the hand-written one, the generated one and, where
# the build has them, the emulated Metal device's (emulated_mps/mps_fallbacks.cpp) and
# the custom operators' (native_custom_ops.cpp)
_TABLES = (("etm_lt_table", "etm_lt_count"), ("etm_lt_gen_table", "etm_lt_gen_count"))
_OPTIONAL_TABLES = (
    ("etm_lt_mps_table", "etm_lt_mps_count"),
    ("etm_lt_cop_table", "etm_lt_cop_count"),  # native_custom_ops.cpp (not in every build)
)


class _Entry(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("signature", ctypes.c_char_p),
        ("slot", ctypes.c_void_p),
    ]


def libtorch_cpu_path() -> Path:
    return Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"


def libtorch_cpu() -> ctypes.CDLL:
    """The ``libtorch_cpu`` torch has loaded (never a second copy: RTLD_NOLOAD)."""
    path = libtorch_cpu_path()
    try:
        return ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    except OSError as exc:
        raise NativeFallbackError(f"libtorch_cpu is not loaded from {path}: {exc}") from exc


def signature(decl: abi.Decl) -> str:
    return f"{decl.restype}({', '.join(decl.argtypes)})"


def _entries(lib: ctypes.CDLL) -> list[_Entry]:
    rows: list[_Entry] = []
    tables = [*_TABLES, *((t, c) for t, c in _OPTIONAL_TABLES if hasattr(lib, c))]
    for table, count in tables:
        n = ctypes.c_int64.in_dll(lib, count).value
        rows.extend((_Entry * n).in_dll(lib, table))
    return rows


def check_signatures(lib: ctypes.CDLL) -> list[tuple[str, int]]:
    """(name, slot address) of each libtorch function ``lib``'s fallbacks call, after
    checking the signature it calls it with against torch's installed headers (an error
    naming the first that disagrees)."""
    decls = abi.declarations()
    rows = []
    for entry in _entries(lib):
        name, sig = entry.name.decode(), entry.signature.decode()
        decl = decls.get(name)
        if decl is None or signature(decl) != sig:
            raise NativeFallbackError(
                f"{name}: the bridge calls it as {sig}, torch's headers declare "
                f"{signature(decl) if decl else 'nothing'}"
            )
        rows.append((name, entry.slot))
    return rows


def bind(lib: ctypes.CDLL) -> dict[str, str]:
    """Fill the bridge's libtorch slots; returns name -> signature of each bound function.

    A function torch's headers declare with another signature, or that libtorch does not
    export, is an error naming it (the bridge then serves these shims in Python only)."""
    decls = abi.declarations()
    torch_lib = libtorch_cpu()
    bound: dict[str, str] = {}
    for name, slot in check_signatures(lib):
        fn = getattr(torch_lib, name, None)
        if fn is None:
            raise NativeFallbackError(f"{name}: libtorch_cpu does not export it")
        ctypes.c_void_p.from_address(slot).value = ctypes.cast(fn, ctypes.c_void_p).value
        bound[name] = signature(decls[name])
    return bound


def unbind(lib: ctypes.CDLL) -> None:
    """Empty every slot: the fallbacks go to Python from now on."""
    for entry in _entries(lib):
        ctypes.c_void_p.from_address(entry.slot).value = None
