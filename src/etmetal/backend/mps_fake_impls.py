"""torch's fake implementations that need a real MPS build, run on a CPU stand-in.

Some of the Python fake kernels in ``torch._subclasses.fake_impls`` do real tensor work
on the fake tensor's device: the convolution one calls ``input.contiguous()`` before it
picks the output memory format. On a fake ``mps`` tensor in a Linux build of torch that
work needs the MPS hooks, which only a macOS build links, and fails with "PyTorch is not
linked with support for mps devices" (a conv1d over a transposed input, as speech models'
positional convolutions are written, reaches it).

:func:`cpu_stand_ins` wraps every entry of torch's fake-implementation table for the
duration of an ``mps`` trace: a kernel that fails that way is run again with each fake
``mps`` tensor replaced by a fake CPU tensor of the same sizes, strides and dtype, and its
results come back as fake ``mps`` tensors of the geometry the CPU kernel computed. Only
functional operators (no mutated argument, no aliased result) are retried: their results
are new tensors, so nothing ties them to the inputs' storages the stand-ins replace.
Geometry is what a fake kernel computes, and it is the same on both devices for the
kernels this reaches (the convolution's channels-last choice follows its inputs' layouts
on the CPU backends as on MPS).

A second way in is a ``Tensor`` method: its Python binding opens a device guard for its
tensor's device before it dispatches (``THPVariable_copy_`` and the like), and c10 has
no guard for ``mps`` in a Linux build, so ``t.copy_(src)`` fails that way before any
kernel runs, fake or not (Inductor's re-inplacing pass checks a scatter with
``copy_`` on fake tensors, and circular padding reaches it).
:class:`MethodsThroughTheDispatcher` calls such a method again as its ATen operator
(``torch.ops.aten.<name>``, which picks the overload from the arguments), which goes to
the fake kernel with no guard. The failed call ran nothing, so the retry is its only run.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

from etmetal.common.targets import CPU_DEVICE, METAL_DEVICE

# what c10 says when a Linux build is asked for the MPS hooks
NO_MPS_BUILD = "not linked with support for mps devices"


def is_functional(op: Any) -> bool:
    """Whether ``op`` neither mutates an argument nor returns an alias of one."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    if any(a.alias_info is not None for a in schema.arguments):
        return False
    return all(r.alias_info is None for r in schema.returns)


def _on_metal(value: Any) -> bool:
    return isinstance(value, FakeTensor) and value.fake_device.type == METAL_DEVICE


def _like(fake_mode: Any, value: FakeTensor, device: str) -> torch.Tensor:
    with fake_mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)


def on_cpu_stand_in(impl: Callable[..., Any]) -> Callable[..., Any]:
    """``impl`` (a fake kernel ``impl(fake_mode, func, *args, **kwargs)``), retried on
    CPU stand-ins when it fails for want of an MPS build (see the module doc)."""

    @functools.wraps(impl)
    def run(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return impl(fake_mode, func, *args, **kwargs)
        except RuntimeError as exc:
            flat = pytree.tree_leaves((args, kwargs))
            if NO_MPS_BUILD not in str(exc) or not is_functional(func):
                raise
            if not any(_on_metal(a) for a in flat):
                raise
        cpu_args, cpu_kwargs = pytree.tree_map_only(
            FakeTensor,
            lambda t: _like(fake_mode, t, CPU_DEVICE) if _on_metal(t) else t,
            (args, kwargs),
        )
        out = impl(fake_mode, func, *cpu_args, **cpu_kwargs)
        return pytree.tree_map_only(
            FakeTensor,
            lambda t: _like(fake_mode, t, METAL_DEVICE) if t.fake_device.type == CPU_DEVICE else t,
            out,
        )

    return run


def aten_op_of_method(func: Any) -> Any:
    """The ATen operator packet a ``Tensor`` method binds (``Tensor.copy_`` ->
    ``aten.copy_``), or None for anything else."""
    if getattr(func, "__objclass__", None) is not torch._C.TensorBase:
        return None
    try:
        return getattr(torch.ops.aten, func.__name__)
    except AttributeError:
        return None


class MethodsThroughTheDispatcher(TorchFunctionMode):
    """A ``Tensor`` method on a fake ``mps`` tensor that fails in its binding's device
    guard for want of an MPS build runs again as its ATen operator (see the module doc)."""

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:
            op = aten_op_of_method(func)
            if NO_MPS_BUILD not in str(exc) or op is None:
                raise
            if not any(_on_metal(a) for a in pytree.tree_leaves((args, kwargs))):
                raise
        return op(*args, **kwargs)


@contextlib.contextmanager
def cpu_stand_ins() -> Iterator[None]:
    """Every functional fake kernel of torch's table retries on CPU stand-ins, and
    ``Tensor`` methods whose device guard needs an MPS build go through the dispatcher;
    undone on exit (also when the trace fails)."""
    from unittest import mock

    from torch._subclasses import fake_impls

    table = fake_impls.op_implementations_dict
    wrapped = {op: on_cpu_stand_in(impl) for op, impl in table.items() if is_functional(op)}
    with mock.patch.dict(table, wrapped), MethodsThroughTheDispatcher():
        yield
