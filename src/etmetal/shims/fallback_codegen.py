"""The C of every fallback served by libtorch's own exported shim, generated from torch's headers.

``native_fallbacks.cpp`` hand-writes the seven fallbacks whose checks it owns (the
products' dense ``out``, flash attention's dropout). Every other ``aoti_torch_cpu_<op>``
the host target allows, and the tensor utilities a host ``.so`` calls (``copy_``,
``zero_``, ``item_*``, ``scalar_to_tensor_*``, ``clone``), is generated here from one
description: the declaration :mod:`abi` reads from torch's installed headers, with each
parameter's spelling and name. A parameter's role follows torch's own convention in its
generated ``c_shim_cpu.h`` (checked against each op's ATen schema by a test):

- ``AtenTensorHandle x``: a tensor, lent to libtorch as a tensor over the record's
  memory (no copy, the record's strides);
- ``AtenTensorHandle* retN`` (any name starting ``ret``): a result, adopted as a native
  record of kind 3 once libtorch made it;
- ``AtenTensorHandle* x`` otherwise: an optional tensor (NULL: None);
- ``const AtenTensorHandle* x`` / ``const AtenTensorHandle** x`` followed by ``x_len_``:
  a list of tensors / of optional tensors;
- ``x_len_`` after ``x``: its length;
- anything else (scalars, ``const int64_t*`` arrays, ``T*`` optional scalars): passed
  through as they came (lengths too).

The generated functions are ``etm_gen_<shim>``, 1 when served, 0 when Python must serve
or report the call; their libtorch slots form ``etm_lt_gen_table``, bound and checked
like ``etm_lt_table``. The output is two files built with ``native_fallbacks.cpp``:
:data:`HEADER_NAME` (declarations, for the bridge) and :data:`SOURCE_NAME` (included at
the end of ``native_fallbacks.cpp``, whose loan helpers it calls).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from etmetal.common.fallback_table import fallback_shims
from etmetal.common.targets import HOST

from . import abi
from .abi_codes import DTYPE_CODES

HEADER_NAME = "native_generated.h"
SOURCE_NAME = "native_generated.inc"

TENSOR, OUTPUT, OPTIONAL, LIST, OPTIONAL_LIST, LENGTH, PASS = (
    "tensor",
    "output",
    "optional",
    "list",
    "optional_list",
    "length",
    "pass",
)

# shims native_fallbacks.cpp serves by hand (its NATIVE_PATHS); never generated twice
HAND_WRITTEN = frozenset(
    {
        "aoti_torch_cpu_mm_out",
        "aoti_torch_cpu_bmm_out",
        "aoti_torch_cpu_addmm_out",
        "aoti_torch_cpu_baddbmm_out",
        "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu",
        "aoti_torch_cpu_convolution",
        "aoti_torch_cpu_topk",
    }
)

_ITEM_DTYPES = ("bool", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")
# the tensor utilities served through libtorch's shim of the same name, each with the
# condition (over its parameters' names) under which libtorch's answer is exactly the
# Python shim's; outside it Python serves or reports (dtype conversion, reshaping copies,
# clone's strides)
UTILITIES: dict[str, str] = {
    "aoti_torch_copy_": "etm_same_geometry({self}, {src})",
    "aoti_torch_tensor_copy_": "etm_same_geometry({dst}, {src})",
    "aoti_torch_assign_tensors": "etm_same_geometry({dst}, {src})",
    "aoti_torch_zero_": "1",
    # Python's clone is contiguous, libtorch's keeps a dense layout: equal when contiguous
    "aoti_torch_clone": "etm_rec_contiguous({self})",
    # a dense source has no holes whose bytes Python's copy would carry over
    "aoti_torch_clone_preserve_strides": "etm_rec_dense({self})",
    **{
        f"aoti_torch_item_{d}": f"etm_rec_dtype({{tensor}}) == {DTYPE_CODES[d]}"
        for d in _ITEM_DTYPES
    },
    **{f"aoti_torch_scalar_to_tensor_{d}": "1" for d in _ITEM_DTYPES},
}


class UnsupportedSignature(ValueError):
    """A parameter whose role the naming convention does not decide."""


@dataclass(frozen=True)
class Entry:
    """One generated shim: its declaration and each parameter's role."""

    decl: abi.Decl
    names: tuple[str, ...]
    roles: tuple[str, ...]
    guard: str = "1"

    @property
    def function(self) -> str:
        return f"etm_gen_{self.decl.name.removeprefix('aoti_torch_')}"


def roles(params: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Each parameter's role (module docstring), or UnsupportedSignature naming it."""
    out: list[str] = []
    for i, (spelled, name) in enumerate(params):
        t = " ".join(spelled.split())
        if out and name == f"{params[i - 1][1]}_len_":  # a list's or an array's length
            out.append(LENGTH)
        elif t == "AtenTensorHandle":
            out.append(TENSOR)
        elif t == "AtenTensorHandle*":
            out.append(OUTPUT if name.startswith("ret") else OPTIONAL)
        elif t in ("const AtenTensorHandle*", "const AtenTensorHandle**"):
            nxt = params[i + 1][1] if i + 1 < len(params) else ""
            if nxt != f"{name}_len_":
                raise UnsupportedSignature(f"{name}: a tensor list without {name}_len_")
            out.append(LIST if t.endswith("e*") else OPTIONAL_LIST)
        elif "AtenTensorHandle" in t or "Handle" in t:
            raise UnsupportedSignature(f"{name}: {spelled}")
        else:
            out.append(PASS)
    return tuple(out)


def _entry(name: str, guard: str = "1") -> Entry | None:
    decl = abi.declarations().get(name)
    params = abi.parameters().get(name)
    if decl is None or params is None or not decl.returns_error:
        return None
    try:
        r = roles(params)
    except UnsupportedSignature:
        return None
    names = tuple(n for _, n in params)
    return Entry(decl, names, r, guard.format(**{n: f"a{i}" for i, n in enumerate(names)}))


@functools.lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    """Every generated shim: the host fallbacks torch's ``c_shim_cpu.h`` declares (less
    the hand-written ones), then the utilities, in a fixed order."""
    found = []
    for name in sorted(fallback_shims(HOST.name) - HAND_WRITTEN):
        e = _entry(name)
        if e is not None:
            found.append(e)
    for name, guard in UTILITIES.items():
        e = _entry(name, guard)
        if e is not None:
            found.append(e)
    return tuple(found)


def _params(decl: abi.Decl) -> str:
    return ", ".join(f"{t} a{i}" for i, t in enumerate(decl.argtypes)) or "void"


def _signature(decl: abi.Decl) -> str:
    return f"{decl.restype}({', '.join(decl.argtypes)})"


def _function(e: Entry, index: int) -> str:
    slot = f"etm_lt_gen_{index}"
    steps: list[str] = []
    args: list[str] = []
    outs: list[str] = []
    for i, role in enumerate(e.roles):
        a = f"a{i}"
        if role == TENSOR:
            steps.append(
                f"  void* t{i} = nullptr;\n  ok = ok && etm_loan_tensor(&loan, {a}, &t{i});\n"
            )
            args.append(f"t{i}")
        elif role == OPTIONAL:
            steps.append(
                f"  void *t{i} = nullptr, *p{i} = nullptr;\n"
                f"  ok = ok && etm_loan_optional(&loan, {a}, &t{i}, &p{i});\n"
            )
            args.append(f"p{i}")
        elif role == LIST:
            steps.append(
                f"  void* t{i}[ETM_LOAN_MAX];\n"
                f"  ok = ok && etm_loan_list(&loan, {a}, a{i + 1}, t{i});\n"
            )
            args.append(f"t{i}")
        elif role == OPTIONAL_LIST:
            steps.append(
                f"  void *t{i}[ETM_LOAN_MAX], *p{i}[ETM_LOAN_MAX];\n"
                f"  ok = ok && etm_loan_optional_list(&loan, {a}, a{i + 1}, t{i}, p{i});\n"
            )
            args.append(f"p{i}")
        elif role == OUTPUT:
            steps.append(f"  void* o{i} = nullptr;\n  ok = ok && {a} != nullptr;\n")
            args.append(f"&o{i}")
            outs.append(f"o{i}")
        else:
            if role == LENGTH and e.roles[i - 1] == PASS:  # an array: libtorch reads a_len items
                steps.append(f"  ok = ok && {a} >= 0 && ({a} == 0 || a{i - 1});\n")
            if e.names[i] == "dtype":  # a code libtorch would not refuse but crash on
                spelled = abi.parameters()[e.decl.name][i][0]
                code = f"*(const int32_t*){a}" if spelled.endswith("*") else a
                null_ok = f"!{a} || " if spelled.endswith("*") else ""
                steps.append(f"  ok = ok && ({null_ok}etm_dtype_known({code}));\n")
            args.append(a)
    head = f"int {e.function}({_params(e.decl)}) {{\n"
    ready = f"etm_native_fallbacks && {slot}" + (" && etm_can_adopt()" if outs else "")
    body = f"  if (!({ready})) return 0;\n  etm_loan loan;\n  loan.n = 0;\n  bool ok = true;\n"
    body += "".join(steps)
    body += f"  ok = ok && ({e.guard});\n"
    body += f"  int32_t rc = ok ? {slot}({', '.join(args)}) : 1;\n"
    if not outs:
        return head + body + "  etm_loan_end(&loan);\n  return rc == 0;\n}\n"
    n = len(outs)
    body += (
        f"  void* made[{n}] = {{{', '.join(outs)}}};\n"
        f"  bool fresh = rc == 0 && etm_loan_fresh(&loan, made, {n});\n"
        "  etm_loan_end(&loan);\n"
        f"  void* adopted[{n}];\n"
        f"  if (!fresh || !etm_adopt_all(made, {n}, adopted)) return 0;\n"
    )
    body += "".join(
        f"  *(void**)a{i} = adopted[{k}];\n"
        for k, i in enumerate(j for j, r in enumerate(e.roles) if r == OUTPUT)
    )
    return head + body + "  return 1;\n}\n"


def header() -> str:
    lines = [
        "// generated by etmetal.shims.fallback_codegen from torch's headers; do not edit",
        "#ifndef ETMETAL_NATIVE_GENERATED_H",
        "#define ETMETAL_NATIVE_GENERATED_H",
        "#include <stdint.h>",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        *(f"int {e.function}({_params(e.decl)});" for e in entries()),
        "#ifdef __cplusplus",
        '}  // extern "C"',
        "#endif",
        "#endif  // ETMETAL_NATIVE_GENERATED_H",
    ]
    return "\n".join(lines) + "\n"


def source() -> str:
    es = entries()
    parts = ["// generated by etmetal.shims.fallback_codegen from torch's headers; do not edit\n"]
    for i, e in enumerate(es):
        parts.append(
            f"typedef {e.decl.restype} (*etm_lt_gen_fn_{i})({', '.join(e.decl.argtypes)});\n"
            f"static etm_lt_gen_fn_{i} etm_lt_gen_{i} = nullptr;\n"
        )
    rows = "".join(
        f'    ETM_LT("{e.decl.name}", "{_signature(e.decl)}", etm_lt_gen_{i}),\n'
        for i, e in enumerate(es)
    )
    parts.append(f"const etm_lt_entry etm_lt_gen_table[] = {{\n{rows}}};\n")
    parts.append(f"const int64_t etm_lt_gen_count = {len(es)};\n")
    parts.extend(_function(e, i) for i, e in enumerate(es))
    return "".join(parts)


def files() -> dict[str, bytes]:
    """The generated files, by name, for a build that compiles ``native_fallbacks.cpp``."""
    return {HEADER_NAME: header().encode(), SOURCE_NAME: source().encode()}


def native_paths() -> dict[str, str]:
    """shim -> the C the bridge serves it with before Python (bridge._native_path)."""
    return {
        e.decl.name: (
            f"  if ({e.function}({', '.join(f'a{i}' for i in range(len(e.roles)))})) "
            "{ ETM_HIT_NATIVE(); return 0; }\n"
        )
        for e in entries()
    }
