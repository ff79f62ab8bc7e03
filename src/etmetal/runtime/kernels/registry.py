"""The kernel registry: operator name -> Python kernel.

Names are ``"namespace::op.overload"`` exactly as the program's operator table spells
them (``"aten::add.out"``, ``"cortex_m::quantized_add.out"``; no overload -> no dot).

Calling convention (what every kernel implements):

- A kernel is called with the instruction's argument values in schema order, out
  arguments included, as Python values: tensors are ``torch.Tensor`` views over the
  method's planned memory (strides from the dim order), scalars are int/float/bool
  (a ``ScalarType`` argument is its ExecuTorch code, an int), lists are Python lists,
  absent optionals are ``None``, strings are ``str``.
- A kernel writes its results into the out tensor(s) and returns ``None``; it may
  ``resize_`` an out tensor within its planned capacity for dynamic shapes.
- The program also lists each op's return slots after its arguments. A return slot
  that is one of the arguments (the usual ``Tensor(a!) out``) is not passed again. A
  return slot holding a tensor that is not an argument is passed after the arguments
  (``executorch_prim::et_view`` writes its view there). A scalar return slot (the
  ``executorch_prim`` arithmetic, ``aten::sym_size.int``) receives the kernel's
  return value.

Modules ``etmetal.runtime.kernels.<family>`` register kernels on import with
``@register_kernel(name)``. The registry imports the built-in families, then the
``executorch.runtime.kernels`` entry-point group (entry name = operator name, value =
kernel callable or a module that registers on import); later registrations override
earlier ones. The table is closed (:mod:`.table`): a name nobody registered gets torch's
own implementation (``aten.py``) only when ExecuTorch's kernel libraries provide it;
any other name has no kernel, and the method that names it does not load.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Callable
from importlib import metadata

from . import table
from .aten import Kernel, make_kernel, torch_kernel, torch_op

ENTRY_POINT_GROUP = "executorch.runtime.kernels"
BUILTIN_FAMILIES = ("prim", "dim_order", "quantized", "view_copy", "max_pool", "cortex_m")
# families that may be absent from a build (another engineer's module)
OPTIONAL_FAMILIES = frozenset({"cortex_m"})

_kernels: dict[str, Kernel] = {}
_num_returns: dict[str, int] = {}
_resolved: dict[str, Kernel | None] = {}  # torch-backed kernels of table names, built once
_loaded = False
_lock = threading.RLock()


def register_kernel(name: str, *, num_returns: int | None = None) -> Callable[[Kernel], Kernel]:
    """Decorator: register ``fn`` as the kernel for operator ``name`` (overrides earlier ones).

    ``num_returns`` tells how many trailing slots of the instruction are return slots
    when torch knows no schema for the operator (otherwise the schema says so).
    """
    if "::" not in name:
        raise ValueError(f"kernel name {name!r} must be 'namespace::op.overload'")

    def decorate(fn: Kernel) -> Kernel:
        with _lock:
            _kernels[name] = fn
            _resolved.pop(name, None)
            if num_returns is not None:
                _num_returns[name] = num_returns
        return fn

    return decorate


def allow_torch_operator(name: str, *, num_returns: int | None = None) -> Kernel:
    """Let programs call ``name`` through torch's own implementation (``torch.ops``).

    An explicit decision, like ``register_kernel``: use it for an operator outside the
    table whose torch implementation you trust with your process (no file, process or
    unchecked-memory side effects). Returns the kernel it registered.
    """
    op = torch_op(name)
    if op is None:
        raise ValueError(f"torch has no operator {name!r} to allow ('namespace::op.overload')")

    kernel = make_kernel(op)
    register_kernel(name, num_returns=num_returns)(kernel)
    return kernel


def _import_builtins() -> None:
    for family in BUILTIN_FAMILIES:
        module = f"{__package__}.{family}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if family in OPTIONAL_FAMILIES and exc.name == module:
                continue
            raise


def _load_entry_points() -> None:
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not take the runtime down
            warnings.warn(
                f"kernel entry point {ep.name!r} ({ep.value}) failed to load: {exc}", stacklevel=2
            )
            continue
        if callable(obj):
            register_kernel(ep.name)(obj)


def ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        _import_builtins()
        _load_entry_points()
        _loaded = True


def lookup(name: str) -> Kernel | None:
    """The kernel for operator ``name``, or ``None`` when nothing implements it."""
    ensure_loaded()
    kernel = _kernels.get(name)
    if kernel is not None:
        return kernel
    if not table.in_table(name):  # closed: the program's choice of name is not enough
        return None
    with _lock:
        if name not in _resolved:
            _resolved[name] = torch_kernel(name)
        return _resolved[name]


def registered_names() -> list[str]:
    ensure_loaded()
    return sorted(_kernels)


def num_returns(name: str) -> int | None:
    """How many trailing instruction slots are return slots, when known."""
    if name in _num_returns:
        return _num_returns[name]
    op = torch_op(name)
    if op is None:
        return None
    return len(op._schema.returns)


def num_arguments(name: str) -> int | None:
    """How many leading instruction slots are arguments, when torch knows the schema."""
    op = torch_op(name)
    return None if op is None else len(op._schema.arguments)
