"""Which operators an extern-node table may make the proxy executor call.

The table travels beside the ``.so`` in the program, so the names in it are the
program's choice. An operator is allowed when it can reach nothing but its own tensor
arguments:

- an ATen overload (``aten::``) that returns something or writes a tensor argument
  (functional, out and in-place variants), minus the ones whose effect reaches beyond
  their arguments: files (``from_file``, ``save``), process state (``manual_seed``,
  ``set_grad_enabled``, printing, warnings), storage swaps and views whose geometry ATen
  does not check against the storage (``set_``, ``_unsafe_*``, nested/sparse
  constructors that skip their invariant checks) and autograd;
- a custom operator defined through ``torch.library`` in this process (by the user's
  code or a library it imported), outside the namespaces torch keeps for itself
  (``prims``, ``debugprims`` (which reads tensors from files), ``inductor``, ...);
- an operator named with :func:`allow_extern_operator` (e.g. one a C++ library
  registered, which ``torch.library`` does not record).

Everything else, including any namespace the process does not know, is refused when
the table is parsed, before the ``.so`` runs.
"""

from __future__ import annotations

import re
import threading

import torch

from etmetal.common.targets import METAL_DEVICE


class ExternNodeError(ValueError):
    """The extern-node table is malformed or names an operator this process lacks (both
    executors raise it: the Python one in ``proxy_executor``, the native one in ``proxy_native``)."""


# Namespaces torch itself defines operators in (C++ or its own Python modules): never
# "custom ops of the loading process", whatever torch.library recorded for them.
TORCH_NAMESPACES = frozenset(
    {
        "aten", "prim", "prims", "debugprims", "rngprims", "inductor", "profiler", "_native",
        "debug_mode_ops", "export", "higher_order", "c10d", "_c10d_functional",
        "_c10d_functional_autograd", "_dtensor", "quantized", "_quantized", "mkldnn",
        "onednn", "sparse", "_test", "_inductor_test", "fsdp", "streams", "symm_mem",
        "_nested", "xnnpack", "vulkan", "cuda",
        METAL_DEVICE,  # torch.ops.mps: torch's own Metal ops, named after the device
    }
)  # fmt: skip

# ATen overload names (before the dot) whose effect reaches beyond their arguments
_DENIED_ATEN = frozenset(
    {
        "from_file", "save", "load", "_print", "warn", "manual_seed", "set_grad_enabled",
        "backward", "_backward", "record_stream", "set_", "set", "set_data", "_set_item",
        "_cufft_clear_plan_cache", "_cufft_set_plan_cache_max_size", "_make_dep_token",
        "_propagate_xla_data", "dist_backward", "_reinterpret_tensor", "_pin_memory",
        "pin_memory", "_nested_view_from_buffer", "_nested_view_from_buffer_copy",
        "_nested_view_from_jagged", "_nested_view_from_jagged_copy",
        "_unsafe_set_version_counter", "_version",
        # geometry set by the caller over the argument's memory: ATen checks it against
        # the storage, but a view aliasing shim memory with any geometry (or an argument's
        # geometry changed in place) is nothing a compiled .so needs from the proxy
        "as_strided", "as_strided_",
    }
)  # fmt: skip
# families, by prefix: unchecked indexing/views, sparse constructors without checks
_DENIED_ATEN_PATTERN = re.compile(r"^(_?unsafe_|_sparse_\w*_unsafe$|_nested_tensor_from)")

_explicit: set[str] = set()
_lock = threading.Lock()


def allow_extern_operator(name: str) -> None:
    """Let extern-node tables name ``name`` (``"namespace::op"`` or ``"namespace::op.overload"``)
    although the rules above would refuse it: an explicit decision of the loading process."""
    if "::" not in name:
        raise ValueError(f"operator name {name!r} must be 'namespace::op[.overload]'")
    with _lock:
        _explicit.add(name)


def disallow_extern_operator(name: str) -> None:
    """Undo :func:`allow_extern_operator`."""
    with _lock:
        _explicit.discard(name)


def _custom_op_defined_here(qualname: str) -> bool:
    # torch.library records every schema it defined in this process (custom_op and
    # Library.define); ops registered from C++ are not there and need allow_extern_operator
    defs = getattr(torch.library, "_defs", ())
    return qualname in defs


# why refusal() refuses, one sentence per rule: the native executor's rules table
# (shims/proxy_rules.py) is generated from these and the sets above, so the two
# implementations give the same words
REASON_DENIED = (
    "its effect reaches beyond its tensor arguments (files, process state or unchecked memory)"
)
REASON_STORAGE = "it takes a raw storage"
REASON_SIDE_EFFECT = "it returns nothing and writes no argument: it exists for a side effect"
REASON_TORCH_NAMESPACE = "'{namespace}' operators are torch internals, not custom operators"
REASON_NOT_DEFINED_HERE = (
    "it was not defined with torch.library in this process (an operator registered "
    "from C++ must be allowed with etmetal.shims.extern_ops.allow_extern_operator)"
)
DENIED_ATEN = _DENIED_ATEN
DENIED_ATEN_PATTERN = _DENIED_ATEN_PATTERN


def explicit_names() -> tuple[str, ...]:
    """The names :func:`allow_extern_operator` allowed, sorted."""
    with _lock:
        return tuple(sorted(_explicit))


def custom_op_qualnames() -> tuple[str, ...]:
    """The operators ``torch.library`` defined in this process (``ns::name``), sorted."""
    return tuple(sorted(str(d) for d in getattr(torch.library, "_defs", ())))


def refusal(namespace: str, name: str, overload: str, schema: torch.FunctionSchema) -> str | None:
    """Why an extern-node table may not call ``namespace::name.overload``; None if it may."""
    qualname = f"{namespace}::{name}"
    full = f"{qualname}.{overload}" if overload and overload != "default" else qualname
    with _lock:
        if qualname in _explicit or full in _explicit:
            return None
    if namespace == "aten":
        if name in _DENIED_ATEN or _DENIED_ATEN_PATTERN.match(name):
            return REASON_DENIED
        if any("Storage" in str(a.type) for a in schema.arguments):
            return REASON_STORAGE
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        if not schema.returns and not writes:
            return REASON_SIDE_EFFECT
        return None
    if namespace in TORCH_NAMESPACES:
        return REASON_TORCH_NAMESPACE.format(namespace=namespace)
    if not _custom_op_defined_here(qualname):
        return REASON_NOT_DEFINED_HERE
    return None
