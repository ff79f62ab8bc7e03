"""Resource limits checked before allocation, refused with the numbers in the message."""

from __future__ import annotations

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

from etmetal.runtime import InvalidProgramError, ResourceLimitError, Runtime


class WithConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.lin(x)


@pytest.fixture(scope="module")
def const_pte():
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    ep = torch.export.export(WithConstant().eval(), (torch.randn(2, 64),), strict=False)
    edge = to_edge_transform_and_lower(
        ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)
    )
    return edge.to_executorch().buffer


def test_constants_count_against_the_memory_cap(const_pte):
    meta = Runtime.get().load_program(const_pte).metadata("forward")
    planned = sum(meta.memory_planned_buffer_sizes)
    constants = (64 * 64 + 64) * 4  # weight and bias, copied per method
    cap = planned + constants - 1
    program = Runtime.get().load_program(const_pte, memory_cap=cap)
    with pytest.raises(
        ResourceLimitError, match=rf"constant tensor value .* over the cap of {cap}"
    ):
        program.load_method("forward")
    Runtime.get().load_program(const_pte, memory_cap=cap + 1).load_method("forward")


def test_segment_past_the_end_of_the_file_is_refused_with_offsets(demos):
    data = demos["patch_embedding"].pte
    pte = deserialize_pte_binary(data)
    assert pte.program.segments is not None or pte.named_data is not None
    # cut the file inside its last segment
    cut = len(data) - 16
    with pytest.raises(
        InvalidProgramError, match=rf"ends past the end of the file \({cut} bytes\)"
    ):
        Runtime.get().load_program(data[:cut])


def test_tensor_rank_over_the_limit_is_refused(const_pte):
    pte = deserialize_pte_binary(const_pte)
    plan = pte.program.execution_plan[0]
    index = plan.inputs[0]
    plan.values[index].val.sizes = [1] * 17
    plan.values[index].val.dim_order = list(range(17))
    with pytest.raises(InvalidProgramError, match=rf"value {index}: 17 dims, over .* limit of 16"):
        Runtime.get().load_program(bytes(serialize_pte_binary(pte))).load_method("forward")


def test_truncated_data_file_is_refused_with_offsets(demos):
    from executorch.extension.flat_tensor.serialize.serialize import (
        DataPayload,
        FlatTensorSerializer,
    )

    parsed = deserialize_pte_binary(demos["patch_embedding"].pte)
    named = parsed.named_data
    payload = DataPayload(buffers=list(named.buffers), named_data=dict(named.pte_data))
    ptd = bytes(FlatTensorSerializer().serialize(payload))
    parsed.named_data = None
    pte = bytes(serialize_pte_binary(parsed, extract_delegate_segments=True))
    cut = len(ptd) - 100
    with pytest.raises(
        InvalidProgramError, match=rf"ends past the end of the file \({cut} bytes\)"
    ):
        Runtime.get().load_program(pte, data_files=ptd[:cut], trust_native_code=True)
