"""Portable kernels: an operator of the kernel table, called through its ``torch.ops`` overload.

Only names the closed table holds (:mod:`.table`) or a user allowed explicitly
(``allow_torch_operator``) get here; the registry never builds a kernel for a name the
program alone chose.

An ExecuTorch program names out variants (``aten::add.out``); the instruction holds the
schema's arguments in order, so the kernel passes positional arguments positionally and
keyword-only ones (``alpha``, ``out``) by name. Functional overloads work too: a tensor
result is copied into the slot the program planned for it, a scalar result is returned.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# what every kernel is (the calling convention is the registry's module doc)
Kernel = Callable[..., object]


def torch_op(name: str) -> torch._ops.OpOverload | None:
    """The ``torch.ops`` overload spelled ``name``, if torch knows it."""
    ns, sep, rest = name.partition("::")
    op_name, _, overload = rest.partition(".")
    parts = (ns, op_name, overload or "default")
    if not sep or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        return None
    try:
        op = getattr(getattr(getattr(torch.ops, ns), op_name), overload or "default")
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


def _store(result: object, outs: tuple) -> object:
    if not outs:
        return result
    results = result if isinstance(result, (tuple, list)) else (result,)
    for out, value in zip(outs, results):
        if isinstance(out, torch.Tensor) and isinstance(value, torch.Tensor):
            if out.shape != value.shape:
                out.resize_(value.shape)
            out.copy_(value)
    return None


# torch casts an int passed for an enum argument without a range check (dtype=-1 or
# memory_format=4 crash the process), so enum arguments are converted here, checked;
# required tensor arguments are checked to be tensors for the same reason (below)
_MEMORY_FORMATS = {
    0: torch.contiguous_format,
    1: torch.preserve_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
}
_LAYOUTS = {0: torch.strided}  # ExecuTorch tensors are strided


def _enum(kind: str, table: dict, value: object) -> object:
    if value is None or isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value not in table:
        raise ValueError(f"{value!r} is not a valid {kind} code (valid: {sorted(table)})")
    return table[value]


def _tensor(name: str, value: object) -> object:
    # torch turns None into an undefined tensor, which kernels dereference (aten::copy.out
    # with self=None crashes the process)
    # (a Python number stays allowed: torch wraps it into a tensor, as it always did)
    if not isinstance(value, (torch.Tensor, int, float, bool)):
        raise TypeError(f"argument {name!r} must be a tensor, got {type(value).__name__}")
    return value


def _tensors(name: str, value: object) -> object:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, torch.Tensor) for v in value):
        raise TypeError(f"argument {name!r} must be a list of tensors")
    return value


def _argument_checks(schema) -> list[tuple[int, object]]:
    """(position, check-and-convert) for the arguments torch's binding does not check."""
    from etmetal.runtime.layout import SCALAR_TYPES

    tables = {"ScalarType": SCALAR_TYPES, "MemoryFormat": _MEMORY_FORMATS, "Layout": _LAYOUTS}
    found = []
    for i, a in enumerate(schema.arguments):
        # real_type keeps the enum the schema declares (``type`` erases it to int)
        declared = str(getattr(a, "real_type", a.type))
        kind = declared.removeprefix("Optional[").rstrip("]?")
        if kind in tables:
            table = tables[kind]
            found.append((i, lambda v, kind=kind, table=table: _enum(kind, table, v)))
        elif declared == "Tensor":
            found.append((i, lambda v, name=a.name: _tensor(name, v)))
        elif declared == "List[Tensor]":
            found.append((i, lambda v, name=a.name: _tensors(name, v)))
    return found


def make_kernel(op: torch._ops.OpOverload) -> Kernel:
    schema = op._schema
    n_args = len(schema.arguments)
    n_pos = sum(1 for a in schema.arguments if not a.kwarg_only)
    kw_names = tuple(a.name for a in schema.arguments if a.kwarg_only)
    checks = _argument_checks(schema)
    if checks:
        return _with_checks(_make_call(op, n_args, n_pos, kw_names), checks)
    return _make_call(op, n_args, n_pos, kw_names)


def _with_checks(call: Kernel, checks: list) -> Kernel:
    def kernel(*args):
        args = list(args)
        for i, convert in checks:
            if i < len(args):
                args[i] = convert(args[i])
        return call(*args)

    kernel.__name__ = kernel.__qualname__ = getattr(call, "__name__", "aten_kernel")
    return kernel


def _make_call(op: torch._ops.OpOverload, n_args: int, n_pos: int, kw_names: tuple) -> Kernel:
    schema = op._schema

    if not kw_names:

        def kernel(*args):
            if len(args) == n_args:
                return op(*args)
            return _store(op(*args[:n_args]), args[n_args:])

    else:

        def kernel(*args):
            result = op(*args[:n_pos], **dict(zip(kw_names, args[n_pos:n_args])))
            if len(args) == n_args:
                return result
            return _store(result, args[n_args:])

    kernel.__name__ = f"aten_{schema.name.split('::')[-1]}_{schema.overload_name or 'default'}"
    kernel.__qualname__ = kernel.__name__
    return kernel


def torch_kernel(name: str) -> Kernel | None:
    """The kernel calling torch's overload ``name``; None when torch has none."""
    op = torch_op(name)
    if op is None:
        return None
    # Out variants return their out argument; the runtime ignores it (the return slot
    # is the same value as the out argument), so nothing is converted back.
    return make_kernel(op)
