"""What dim orders ExecuTorch's stock portable kernels accept, operator by operator.

Read from the checks in ``kernels/portable/cpu/op_*.cpp`` and their ``util/`` helpers:

- ``tensors_have_same_dim_order(a, b, ..., out)`` passes only when every tensor's dim order
  is the default one, or every tensor's is channels-last (4-D ``(0, 2, 3, 1)`` or 5-D
  ``(0, 2, 3, 4, 1)``). It compares the labels, not the memory: a 1-D bias next to a
  channels-last activation, or a channels-last tensor whose size-1 channel dim gave it a
  third dim order, fails it although the bytes would be right.
- ``tensor_is_default_dim_order(in)`` on top of it (pooling by average, reductions,
  matmuls, normalizations, ``view_copy``...) leaves only the default dim order.
- ``tensor_is_default_or_channels_last_dim_order`` is all ``convolution`` asks of its
  weight; ``max_pool2d_with_indices`` asks it of its input and output, and computes in
  whatever the output's layout is.
- ``_to_dim_order_copy`` (and ``_clone_dim_order``) take any input and write a default or
  channels-last output: the one conversion the stock runtime runs in both
  ``_skip_dim_order`` modes. ``clone`` wants the same dim order in and out; ``_to_copy``
  wants the default one.

Checks are not the whole story: several kernels pass ``tensors_have_same_dim_order`` on
channels-last tensors and then index them row-major (wrong values, or writes past the
output). So only kernels known to compute right on channels-last tensors may run in it;
every other operator, named here or not, runs in the default dim order. A conversion
never changes a value, so guessing strict costs a copy at worst.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from executorch.exir import memory
from executorch.exir.delegate import executorch_call_delegate

from etmetal.backend.edge_ops import aten_overload

UNIFORM = "uniform"  # every checked tensor default, or every one channels-last
DEFAULT = "default"  # every checked tensor in the default dim order
CONVERSION = "conversion"  # _to_dim_order_copy/_clone_dim_order: output default or channels-last
COPY = "copy"  # clone/_to_copy: rewritten to _to_dim_order_copy when the layout changes


@dataclass(frozen=True)
class KernelLayoutRule:
    """The dim-order constraint of one stock kernel.

    Attributes:
        kind: ``UNIFORM``, ``DEFAULT``, ``CONVERSION`` or ``COPY``.
        check: the kernel's check, quoted in errors.
        exempt: tensor arguments outside the uniformity check that must only be default
            or channels-last each (convolution's weight), or are not checked (its bias).
        unchecked: exempt arguments the kernel does not check at all.
        broadcasting: elementwise with broadcasting, so a lower-rank operand may be given
            leading size-1 dims (to carry a channels-last label) without changing the result.
    """

    kind: str
    check: str
    exempt: frozenset[str] = frozenset()
    unchecked: frozenset[str] = frozenset()
    broadcasting: bool = False


def _uniform(check: str, **kwargs: Any) -> KernelLayoutRule:
    return KernelLayoutRule(UNIFORM, check, **kwargs)


def _default(check: str) -> KernelLayoutRule:
    return KernelLayoutRule(DEFAULT, check)


_SAME = "tensors_have_same_dim_order(in, out)"
_SAME_BINARY = "tensors_have_same_dim_order(a, b, out)"
_ROW_MAJOR = (
    "the default dim order (the kernel takes channels-last labels but indexes its tensors "
    "row-major)"
)

# Kernels that compute right on channels-last tensors: elementwise ones walk all their
# tensors in the same memory order (so with equal shapes, or a single-value operand, any
# common layout is right), and the few with a channels-last code path.
_ELEMENTWISE_UNARY = (
    "relu", "hardtanh", "sigmoid", "tanh", "gelu", "abs", "neg", "exp", "log", "sqrt",
    "rsqrt", "clamp", "leaky_relu", "elu", "hardswish", "hardsigmoid", "sign", "round",
    "floor", "ceil", "reciprocal", "logical_not", "bitwise_not", "erf", "sin", "cos",
)  # fmt: skip
_ELEMENTWISE_BINARY = (
    "add", "sub", "rsub", "mul", "div", "where", "maximum", "minimum", "pow", "fmod",
    "remainder", "atan2", "floor_divide", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
    "masked_fill",
)  # fmt: skip

RULES: dict[str, KernelLayoutRule] = {
    **{name: _uniform(_SAME) for name in _ELEMENTWISE_UNARY},
    **{name: _uniform(_SAME_BINARY, broadcasting=True) for name in _ELEMENTWISE_BINARY},
    "convolution": _uniform(
        "tensors_have_same_dim_order(in, out) and weight default or channels-last",
        exempt=frozenset({"weight", "bias"}),
        unchecked=frozenset({"bias"}),
    ),
    "max_pool2d_with_indices": _uniform("in, out and indices default or channels-last"),
    "upsample_nearest2d": _uniform(_SAME),
    "upsample_bilinear2d": _uniform(_SAME),
    "_to_dim_order_copy": KernelLayoutRule(
        CONVERSION, "dim_order is contiguous or channels-last, out has that dim order"
    ),
    "_clone_dim_order": KernelLayoutRule(
        CONVERSION, "dim_order is contiguous or channels-last, out has that dim order"
    ),
    "clone": KernelLayoutRule(
        COPY, "tensors_have_same_dim_order(self, out), memory_format contiguous or none"
    ),
    "_to_copy": KernelLayoutRule(
        COPY, "tensors_have_same_dim_order(self, out) && tensor_is_default_dim_order(self)"
    ),
}
# Every other kernel runs in the default dim order: many check
# tensor_is_default_dim_order, and several that only check tensors_have_same_dim_order
# index row-major anyway (measured on the stock runtime: permute_copy, slice_copy,
# split_with_sizes_copy, cat, constant_pad_nd give wrong values on channels-last tensors,
# broadcasting add/sub/mul too, and _softmax over the last dim of a channels-last tensor
# writes outside its output).
_DEFAULT_RULE = _default(_ROW_MAJOR)

# call_function targets whose tensors no portable kernel checks: getitem reads an element
# of a list result, delegates and memory planning ops handle their own layouts
_NO_KERNEL = (operator.getitem, executorch_call_delegate, memory.view, memory.alloc)


def rule_for(target: Any) -> KernelLayoutRule | None:
    """The rule for a call_function target, or None when no portable kernel checks its
    tensors' dim orders."""
    if target in _NO_KERNEL:
        return None
    op = aten_overload(target)
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    namespace, _, name = schema.name.partition("::")
    if namespace not in ("aten", "dim_order_ops"):
        return None  # quantized, custom and executorch_prim ops have their own kernels
    if not any(str(ret.type) in ("Tensor", "List[Tensor]") for ret in schema.returns):
        return None  # sym_size and friends
    return RULES.get(name, _DEFAULT_RULE)
