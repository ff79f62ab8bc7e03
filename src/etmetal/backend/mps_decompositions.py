"""Decompositions a macOS build of torch makes on ``mps`` that a Linux build does not.

``aten.scaled_dot_product_attention`` is a C++ composite whose ``mps`` branch is compiled
only into macOS wheels (``#ifdef USE_MPS`` in ``attention.cpp``): there, math attention
on an ``mps`` query becomes ``aten._scaled_dot_product_attention_math_for_mps``, a
Metal fallback (``aoti_torch_mps__scaled_dot_product_attention_math_for_mps_v2``).
A Linux wheel takes the generic math path (``bmm`` + softmax) even for fake ``mps``
tensors, so Inductor would generate a different Metal program than a Mac does.
:class:`MacMpsDecompositions` restores the Mac's choice while the ``mps`` partitioner
predicts and while ``mps_emulated`` compiles.

The other way round, some of Inductor's dispatch-level decompositions index with Python
(``torch._refs.index_select`` does ``x[idx]``), and ``Tensor.__getitem__``'s binding opens
a device guard a Linux build has no ``mps`` guard for. A Mac traces that indexing to
``aten.index.Tensor``; :data:`MPS_TRACING_DECOMPOSITIONS` reaches the same operator
through the dispatcher, and :func:`for_mps_tracing` / :func:`inductor_decompositions_for_mps`
put it in the tables the partitioner and the ``mps_emulated`` compile trace with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from etmetal.common.targets import METAL_DEVICE

aten = torch.ops.aten


def _boolean_mask_to_additive(mask: torch.Tensor | None, dtype: torch.dtype) -> Any:
    # as attention.cpp's convert_boolean_attn_mask: True keeps, False gets -inf
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(
        mask, torch.zeros((), dtype=dtype), torch.full((), float("-inf"), dtype=dtype)
    )


def sdpa_as_on_a_mac(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """The macOS composite's ``mps`` math branch; other cases decompose as usual."""
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    nested = any(t.is_nested for t in (query, key, value))
    # (macOS 15+ takes non-contiguous inputs too, which is what a current Mac runs)
    if query.device.type != METAL_DEVICE or dropout_p != 0.0 or grads or nested:
        return NotImplemented
    mask = _boolean_mask_to_additive(attn_mask, query.dtype)
    out = aten._scaled_dot_product_attention_math_for_mps.default(
        query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )
    return out[0]


def with_overload_packets(
    table: dict[Any, Callable[..., Any]],
) -> dict[Any, Callable[..., Any]]:
    """``table`` plus, for each ``OpOverload`` key, its overload packet (``aten.op``).

    Code that calls the packet (Inductor's attention-fusion replacements call
    ``aten.scaled_dot_product_attention(...)``) reaches ``__torch_function__`` with the
    packet, not ``.default``; without it the call falls through to the Linux composite.
    A packet stands for all its overloads, so it maps to the decomposition its overloads
    share; overloads of one packet with different decompositions need an explicit packet
    entry (which always wins), else this raises rather than pick one.
    """
    packets: dict[Any, Callable[..., Any]] = {}
    for key, decomposition in table.items():
        if not isinstance(key, torch._ops.OpOverload):
            continue
        packet = key.overloadpacket
        if packet in table:
            continue
        if packets.setdefault(packet, decomposition) is not decomposition:
            raise ValueError(
                f"the overloads of {packet} have different decompositions: give the packet "
                "its own entry (a call through it cannot tell which overload it means)"
            )
    return {**packets, **table}


MAC_MPS_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = with_overload_packets(
    {
        aten.scaled_dot_product_attention.default: sdpa_as_on_a_mac,
        torch.nn.functional.scaled_dot_product_attention: sdpa_as_on_a_mac,
    }
)


class MacMpsDecompositions(TorchFunctionMode):
    """Applies :data:`MAC_MPS_DECOMPOSITIONS` while tracing.

    A decomposition table cannot do it: ``scaled_dot_product_attention`` is a C++
    ``CompositeImplicitAutograd`` kernel, which runs (and on a fake ``mps`` tensor in a
    Linux build, fails in its backend choice) before any dispatch-level table is asked.
    ``__torch_function__`` sees the call first.
    """

    def __torch_function__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        decomposition = MAC_MPS_DECOMPOSITIONS.get(func)
        if decomposition is not None:
            out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def index_select_through_the_dispatcher(
    x: torch.Tensor, dim: int, index: torch.Tensor
) -> torch.Tensor:
    """``torch._refs.index_select`` with its Python indexing (``x[idx]``) written as the
    ``aten.index.Tensor`` call that indexing traces to, so no ``Tensor`` method runs."""
    from torch._prims_common import canonicalize_dim, suggest_memory_format

    torch._check(index.ndim <= 1, lambda: f"Index should have dimension 1 or 0 (got {index.ndim})")
    index = aten.reshape.default(index, [-1])
    if x.ndim == 0:  # a scalar is an element of R^1, as in the reference
        return aten.index_copy.default(
            aten.empty_like.default(x), 0, index, aten.expand.default(x, index.shape)
        )
    dim = canonicalize_dim(x.ndim, dim)
    out = aten.index.Tensor(x, [None] * dim + [index])
    return aten.clone.default(out, memory_format=suggest_memory_format(x))


MPS_TRACING_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.index_select.default: index_select_through_the_dispatcher,
}


def for_mps_tracing(table: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """Inductor's decomposition ``table`` with :data:`MPS_TRACING_DECOMPOSITIONS` in place
    of the entries a Linux build cannot trace on fake ``mps`` tensors."""
    return {**table, **{op: d for op, d in MPS_TRACING_DECOMPOSITIONS.items() if op in table}}


@contextlib.contextmanager
def inductor_decompositions_for_mps() -> Iterator[None]:
    """Inductor's own tables (the one it picks, ``select_decomp_table()``, is a cached
    copy) hold :data:`MPS_TRACING_DECOMPOSITIONS` for one compile; restored on exit."""
    from unittest import mock

    from torch._inductor import decomposition

    tables = [decomposition.decompositions, decomposition.select_decomp_table()]
    with contextlib.ExitStack() as stack:
        for table in {id(t): t for t in tables}.values():
            present = {op: d for op, d in MPS_TRACING_DECOMPOSITIONS.items() if op in table}
            stack.enter_context(mock.patch.dict(table, present))
        yield


def views_as_reshapes(gm: torch.fx.GraphModule) -> int:
    """Turn the program's ``aten.view`` calls into ``aten.reshape``; returns how many.

    Export traced the program with CPU kernels and recorded ``reshape`` as ``view``
    wherever the CPU producer's layout allowed it, e.g. ``att.transpose(1, 2).reshape``
    after CPU flash attention, whose output is laid out (batch, seq, heads, dim). On
    ``mps`` the producer is a different kernel (the Metal math attention returns a
    contiguous (batch, heads, seq, dim) tensor), so the recorded view no longer applies.
    ``reshape`` is a view wherever one exists and a copy elsewhere, so in the functional
    graph Inductor compiles it means the same as the view on the CPU layout, and Inductor
    decides from the ``mps`` layouts, as it would for the source program on a Mac.
    """
    count = 0
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op == "call_function" and node.target is aten.view.default:
                node.target = aten.reshape.default
                count += 1
        module.recompile()
    return count
