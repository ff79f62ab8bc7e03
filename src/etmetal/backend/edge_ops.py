"""Edge-dialect operator targets seen as the ATen overloads they wrap."""

from __future__ import annotations

from typing import Any

import torch


def aten_overload(target: Any) -> Any:
    """The ``OpOverload`` behind an fx target (an ``EdgeOpOverload`` wraps one in ``_op``);
    other targets come back unchanged. An ATen ``OpOverload`` has an ``_op`` too (the C++
    builtin), so it must be recognised first."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    inner = getattr(target, "_op", None)
    return inner if isinstance(inner, torch._ops.OpOverload) else target


MISSING = object()  # schema_argument_value: the node passes nothing for the argument


def schema_argument_value(node: torch.fx.Node, index: int, argument: Any) -> Any:
    """The value ``node`` passes for its schema's ``index``-th ``argument`` (by keyword or
    position), or ``MISSING`` when it passes none (the default applies)."""
    if argument.name in node.kwargs:
        return node.kwargs[argument.name]
    if index < len(node.args) and not argument.kwarg_only:
        return node.args[index]
    return MISSING
