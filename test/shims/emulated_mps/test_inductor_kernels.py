"""Inductor's real Metal kernels (its ``mps`` code generation, run on this host by
``make_inductor_kernels.py``) executed by etmetal's MSL executor, compared with eager PyTorch.

The fixture replays each wrapper's launch sequence: the same buffers, ``set_arg_tensor``
indices, thread counts and threadgroup sizes Inductor chose. It names the c10 headers each
library includes; their text is read from the installed torch (``c10_headers``).

The cases cover threadgroup reductions over several SIMD groups and threadgroups with partial
SIMD groups (softmax and layer_norm and rms_norm over 1,000+ elements, var_mean,
sum/amax/log_softmax over a non-last dim, argmax, an int64 amin), float16/bfloat16 kernels,
integer arithmetic, and elementwise kernels (erf-based gelu, pow/atan2/where) dispatched
without a group size.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

from etmetal.shims.emulated_mps import compile_library

sys.path.insert(0, str(Path(__file__).parent))
from c10_headers import expand  # noqa: E402
from inductor_cases import CASES, inputs  # noqa: E402

DATA = json.loads((Path(__file__).parent / "inductor_kernels.json").read_text())


def library_source(lib: dict) -> str:
    # c10's headers from the installed torch, pasted as Inductor pastes them
    src = expand(lib["includes"]) + lib["kernel"]
    # the text Inductor generated, byte for byte
    assert hashlib.sha256(src.encode()).hexdigest() == lib["sha256"]
    return src


def _extent(t: torch.Tensor) -> int:
    """Bytes from a tensor's first to its last element (what a binding of it covers)."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def run_case(
    name: str, xs: list[torch.Tensor], faults: list | None = None, split: bool = True
) -> list[torch.Tensor]:
    """Replay the case's launches; with ``faults`` (a list), under the Metal checker, each
    dispatch's faults appended to it; ``split=False``: synchronising kernels on fibers only."""
    case = DATA["cases"][name]
    tensors = {f"arg{i}_1": x.contiguous() for i, x in enumerate(xs)}
    for buf, spec in case["buffers"].items():
        t = torch.empty_strided(spec["size"], spec["stride"], dtype=getattr(torch, spec["dtype"]))
        tensors[buf] = t.fill_(float("nan") if t.is_floating_point() else -1)  # unwritten shows
    for new, old in case.get("aliases", {}).items():  # a dead buffer reused under a new name
        tensors[new] = tensors[old]
    for step in case["steps"]:
        checked = faults is not None
        source = library_source(case["libraries"][step["lib"]])
        lib = compile_library(source, checked=checked, split=split)
        fn = lib.function("generated_kernel")
        args = {int(i): tensors[n].data_ptr() for i, n in step["args"].items()}
        launch = (args, tuple(step["threads"]), step["group"] and tuple(step["group"]))
        if checked:
            extents = {int(i): _extent(tensors[n]) for i, n in step["args"].items()}
            faults.extend(fn.check(*launch, extents=extents))
        else:
            fn.dispatch(*launch)
    return [tensors[o] for o in case["outputs"]]


@pytest.mark.parametrize("name", sorted(DATA["cases"]))
def test_inductor_mps_kernels_match_eager(name):
    xs = inputs(name)
    expected = CASES[name][0](*xs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    got = run_case(name, xs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        if e.is_floating_point():
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(g, e)


# threadgroup reductions over several SIMD groups, a float16 one, a multi-kernel one
CHECKED = ["softmax", "layer_norm", "var_mean", "argmax", "half_softmax", "log_softmax_dim0"]


@pytest.mark.parametrize("name", CHECKED)
def test_inductor_kernels_run_clean_under_the_metal_checker(name):
    xs = inputs(name)
    expected = CASES[name][0](*xs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    faults: list = []
    got = run_case(name, xs, faults)
    assert faults == []
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_argmax_ties_and_extremes_match_eager():
    # the first index wins a tie (simd_ballot + ctz across SIMD groups and the second stage)
    x = torch.zeros(6, 1111)
    x[0, 700] = x[0, 33] = 5.0
    x[1, :] = -float("inf")
    x[1, 1110] = 0.0
    x[2, 1000] = float("nan")
    x[3, 31] = x[3, 32] = 1.0
    (got,) = run_case("argmax", [x])
    assert torch.equal(got, x.argmax(-1))
