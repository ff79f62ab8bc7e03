"""``executorch_prim::*`` and the symbolic-size ops: scalar arithmetic on SymInts and views.

These mirror ExecuTorch's ``kernels/prim_ops``. Scalar ops return their result (the
runtime stores it in the instruction's return slot); ``et_view`` makes its out tensor
alias the input's memory, as ``memory.view`` promises.
"""

from __future__ import annotations

import math
import operator

import torch

from etmetal.runtime.layout import numel, strides_for

from .registry import register_kernel


def _scalar(name: str, fn) -> None:
    register_kernel(f"executorch_prim::{name}", num_returns=1)(fn)


def _floordiv(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError("executorch_prim::floordiv: integer division by zero")
        return a // b
    return math.floor(a / b)


def _truediv(a, b):
    return a / b


def _mod(a, b):
    if b == 0:
        raise ZeroDivisionError("executorch_prim::mod: modulo by zero")
    # C semantics (sign of the dividend), as the C++ prim op computes it
    return int(math.fmod(a, b)) if isinstance(a, int) and isinstance(b, int) else math.fmod(a, b)


for _name, _fn in {
    "add.Scalar": operator.add,
    "sub.Scalar": operator.sub,
    "mul.Scalar": operator.mul,
    "floordiv.Scalar": _floordiv,
    "floordiv.int": _floordiv,
    "truediv.Scalar": _truediv,
    "mod.Scalar": _mod,
    "mod.int": _mod,
    "eq.Scalar": operator.eq,
    "gt.Scalar": operator.gt,
    "lt.Scalar": operator.lt,
    "ge.Scalar": operator.ge,
    "le.Scalar": operator.le,
    "sym_max.Scalar": max,
    "sym_min.Scalar": min,
}.items():
    _scalar(_name, _fn)


for _name, _fn in {
    "neg.Scalar": operator.neg,
    "ceil.Scalar": math.ceil,
    "round.Scalar": round,  # half to even, like std::nearbyint in the C++ op
    "trunc.Scalar": math.trunc,
    "sym_float.Scalar": float,
    "sym_int.Scalar": int,
    "sym_not.Scalar": operator.not_,
}.items():
    _scalar(_name, _fn)


@register_kernel("executorch_prim::sym_ite.Scalar", num_returns=1)
def sym_ite(cond, a, b):
    return a if cond else b


@register_kernel("aten::sym_size.int", num_returns=1)
def sym_size(t: torch.Tensor, dim: int):
    return t.size(dim)


@register_kernel("aten::sym_numel", num_returns=1)
def sym_numel(t: torch.Tensor):
    return t.numel()


@register_kernel("aten::_local_scalar_dense", num_returns=1)
def local_scalar_dense(t: torch.Tensor):
    return t.item()


@register_kernel("executorch_prim::et_copy_index.tensor", num_returns=0)
def et_copy_index(copy_to: torch.Tensor, copy_from: torch.Tensor, index: int):
    """``copy_to[index] = copy_from``, growing ``copy_to``'s first dim to ``index + 1``."""
    if index < 0:
        raise ValueError(f"et_copy_index: negative index {index}")
    want = [index + 1, *copy_from.shape]
    if copy_to.dim() != len(want) or list(copy_to.shape[1:]) != list(copy_from.shape):
        raise ValueError(
            f"et_copy_index: cannot copy a {list(copy_from.shape)} tensor into a "
            f"{list(copy_to.shape)} tensor"
        )
    if copy_to.shape[0] < index + 1:
        copy_to.resize_(want)
    copy_to[index].copy_(copy_from)


@register_kernel("executorch_prim::et_view.default", num_returns=1)
def et_view(self: torch.Tensor, size: list[int], out: torch.Tensor):
    """Make ``out`` a view of ``self``'s memory with shape ``size`` (no copy)."""
    sizes = [int(s) for s in size]
    if -1 in sizes:
        known = numel([s for s in sizes if s != -1])
        sizes[sizes.index(-1)] = self.numel() // known if known else 0
    if numel(sizes) != self.numel():
        raise ValueError(f"et_view: cannot view a tensor of shape {list(self.shape)} as {sizes}")
    if not self.is_contiguous():
        raise ValueError(
            f"et_view: input of shape {list(self.shape)} with strides {list(self.stride())} "
            "is not in the default dim order; memory.view needs a dense default-order input"
        )
    strides = strides_for(sizes, range(len(sizes)))
    out.set_(self.untyped_storage(), self.storage_offset(), sizes, strides)
