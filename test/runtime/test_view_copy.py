"""The ``aten::view_copy.out`` override: logical element order for any dim order.

Kernel-level cases check it against eager ``reshape``; the regression matrix of
``src/etmetal/examples/view_copy.py`` checks whole programs lowered without the stock-kernel
legalization (so every non-default-dim-order ``view_copy`` reaches the kernel).
"""

from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch

from etmetal.runtime import Runtime
from etmetal.runtime.kernels import lookup
from etmetal.runtime.layout import strides_for

view_copy = lookup("aten::view_copy.out")


def _in_dim_order(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    """``t``'s values laid out densely in ``order`` (outermost first)."""
    out = torch.empty_strided(t.shape, strides_for(t.shape, order), dtype=t.dtype)
    out.copy_(t)
    return out


LAYOUTS = [
    ("contiguous_3d", (2, 3, 4), [0, 1, 2]),
    ("permuted_3d", (2, 3, 4), [2, 0, 1]),
    ("channels_last", (2, 3, 4, 5), [0, 2, 3, 1]),
    ("channels_last_size1", (2, 16, 7, 1), [0, 2, 3, 1]),
    ("permuted_4d", (2, 3, 4, 5), [3, 1, 0, 2]),
    ("channels_last_3d", (2, 3, 2, 4, 5), [0, 2, 3, 4, 1]),
    ("reversed_5d", (2, 3, 2, 4, 5), [4, 3, 2, 1, 0]),
]


@pytest.mark.parametrize("name,shape,order", LAYOUTS, ids=[c[0] for c in LAYOUTS])
@pytest.mark.parametrize("out_layout", ["default", "reversed"])
def test_logical_order_for_any_dim_order(name, shape, order, out_layout):
    x = _in_dim_order(torch.randn(shape), order)
    target = [shape[0], -1]
    want = x.reshape(shape[0], -1)
    out_order = [0, 1] if out_layout == "default" else [1, 0]
    out = _in_dim_order(torch.zeros(want.shape), out_order)
    view_copy(x, target, out)
    assert torch.equal(out, want)
    assert out.stride() == tuple(strides_for(want.shape, out_order))  # layout kept


def test_default_order_takes_one_flat_copy_and_is_exact():
    x = torch.randn(4, 6, 5)
    out = torch.empty(6, 20)
    view_copy(x, [6, 20], out)
    assert torch.equal(out, x.reshape(6, 20))


@pytest.mark.parametrize("size", [[-1], [5, -1, 2], [-1, 1, 3]])
def test_infers_minus_one(size):
    x = _in_dim_order(torch.randn(3, 5, 2), [1, 2, 0])
    want = x.reshape(size)
    out = torch.empty(want.shape)
    view_copy(x, size, out)
    assert torch.equal(out, want)


def test_dynamic_resize_within_planned_memory():
    storage = torch.zeros(64)
    out = storage[:48].view(6, 8)  # planned for the upper bound 6 x 8
    x = _in_dim_order(torch.randn(2, 4, 2, 2), [0, 2, 3, 1])  # 32 elements
    view_copy(x, [4, -1], out)
    assert out.shape == (4, 8) and out.data_ptr() == storage.data_ptr()
    assert torch.equal(out, x.reshape(4, 8))


@pytest.mark.parametrize(
    "size,match",
    [
        ([7, -1], "cannot view"),
        ([2, 2], "has 4 elements"),
        ([-1, -1], "only one"),
        ([-3, 8], "negative"),
    ],
)
def test_size_mismatch_errors_name_the_shapes(size, match):
    x = torch.randn(4, 6)
    with pytest.raises(ValueError, match=match):
        view_copy(x, size, torch.empty(4, 6))


def test_rank_mismatch_with_out_is_an_error():
    with pytest.raises(ValueError, match="out tensor is 3-D"):
        view_copy(torch.randn(4, 6), [24], torch.empty(2, 3, 4))


# ------------------------------------------------------------------ regression matrix

from etmetal.examples.view_copy import CASES, get_case  # noqa: E402


@functools.cache
def _edge(case_name: str, skip_dim_order: bool):
    from etmetal.testing.view_copy_matrix import to_edge_for

    return to_edge_for(get_case(case_name), skip_dim_order=skip_dim_order)


def _lower(case, skip_dim_order: bool, remove_view_copy: bool) -> bytes:
    from etmetal.layout.config import backend_config

    # to_executorch rewrites the edge program in place: lower a copy of the cached one
    edge = copy.deepcopy(_edge(case.name, skip_dim_order))
    config = backend_config(remove_view_copy=remove_view_copy, legalize_for_stock_kernels=False)
    return edge.to_executorch(config).buffer


def _non_default_view_copies(method) -> int:
    """view_copy instructions whose input is not in the default dim order."""
    count = 0
    for chain in method._chains:
        for step, label in zip(chain.steps, chain.labels):
            if "aten::view_copy.out" in label:
                args = getattr(step, "args", ())  # static steps are functools.partial
                if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
                    count += 1
    return count


@pytest.mark.parametrize(
    "case,skip_dim_order,remove_view_copy",
    [(c, s, r) for c in CASES for s, r in itertools.product((False, True), (False, True))],
    ids=lambda v: v.name if hasattr(v, "name") else str(v),
)
def test_view_copy_matrix_exact_without_legalization(case, skip_dim_order, remove_view_copy):
    pte = _lower(case, skip_dim_order, remove_view_copy)
    method = Runtime.get().load_program(pte).load_method("forward")
    inputs = case.run_inputs()
    with torch.no_grad():
        want = case.module()(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    got = method.execute(list(inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if case.bitwise:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_matrix_really_feeds_non_default_dim_orders_to_the_kernel():
    by_name = {c.name: c for c in CASES}
    pte = _lower(by_name["patch_embed"], False, False)
    method = Runtime.get().load_program(pte).load_method("forward")
    method.execute(list(by_name["patch_embed"].run_inputs()))
    assert _non_default_view_copies(method) >= 1
