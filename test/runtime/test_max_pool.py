"""``aten::max_pool2d_with_indices.out`` on int8 channels-last inputs.

ATen's own channels-last integer max pool rejects images of more than 127 elements for
int8; quantized programs that leave a max pool to the portable kernels hit exactly that
(ExecuTorch's backend-suite max-pool cases on the ``cortex_m_host`` flow). The reference
is eager ``max_pool2d_with_indices`` on a contiguous copy of the same values.
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge

from etmetal.runtime import Runtime
from etmetal.runtime.kernels import lookup

max_pool = lookup("aten::max_pool2d_with_indices.out")

CASES = [
    # kernel, stride, padding, dilation, ceil_mode
    ("ceil_mode", [3, 3], [2, 2], [1, 1], [1, 1], True),
    ("dilation", [3, 3], [1, 1], [1, 1], [2, 2], False),
    ("ceil_mode_and_dilation", [2, 3], [2, 1], [1, 1], [2, 2], True),
]


def _reference(x, kernel, stride, padding, dilation, ceil_mode):
    return torch.ops.aten.max_pool2d_with_indices(
        x.contiguous(), kernel, stride, padding, dilation, ceil_mode
    )


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_int8_channels_last_matches_eager_on_contiguous_copy(case):
    _, kernel, stride, padding, dilation, ceil_mode = case
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (2, 5, 17, 19), dtype=torch.int8, generator=gen)
    x_cl = x.to(memory_format=torch.channels_last)
    # the condition the kernel exists for: ATen refuses this input as laid out
    with pytest.raises(RuntimeError, match="input_depth"):
        torch.ops.aten.max_pool2d_with_indices(x_cl, kernel, stride, padding, dilation, ceil_mode)
    want_values, want_indices = _reference(x, kernel, stride, padding, dilation, ceil_mode)
    out = torch.empty(want_values.shape, dtype=torch.int8).to(memory_format=torch.channels_last)
    indices = torch.empty(want_indices.shape, dtype=torch.int64).to(
        memory_format=torch.channels_last
    )
    max_pool(x_cl, kernel, stride, padding, dilation, ceil_mode, out, indices)
    assert torch.equal(out, want_values)
    assert torch.equal(indices, want_indices)
    # the planned dim order is kept
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert indices.is_contiguous(memory_format=torch.channels_last)


def test_too_small_out_names_operator_and_slot():
    x = torch.zeros((1, 2, 8, 8), dtype=torch.int8)
    out = torch.empty((1, 2, 2, 2), dtype=torch.int8)
    indices = torch.empty((1, 2, 4, 4), dtype=torch.int64)
    with pytest.raises(ValueError, match=r"max_pool2d_with_indices\.out: out"):
        max_pool(x, [2, 2], [2, 2], [0, 0], [1, 1], False, out, indices)


class _ChannelsLastPool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, 3, stride=2, padding=1, dilation=2, ceil_mode=True)


def test_program_with_channels_last_int8_max_pool_runs():
    # a whole program: the input keeps channels-last dim order through export
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-128, 128, (1, 4, 16, 16), dtype=torch.int8, generator=gen).to(
        memory_format=torch.channels_last
    )
    program = to_edge(torch.export.export(_ChannelsLastPool(), (x,))).to_executorch()
    method = Runtime.get().load_program(program.buffer).load_method("forward")
    (got,) = method.execute([x])
    want = _ChannelsLastPool()(x.contiguous())
    assert torch.equal(got.contiguous(), want)
