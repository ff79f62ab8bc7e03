"""``InlineScalarConstantsPass``: 0-dim constants of elementwise arithmetic become numbers again."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etmetal.backend.passes.inline_scalar_constants_pass import InlineScalarConstantsPass


def inline_scalar_constants(ep: torch.export.ExportedProgram) -> int:
    """Run the pass the way ``prepare_for_aoti`` does; how many operands became numbers."""
    pass_ = InlineScalarConstantsPass(ep)
    result = pass_(ep.graph_module)
    assert result.graph_module is ep.graph_module  # rewritten in place
    assert result.modified == (pass_.replaced > 0)
    return pass_.replaced


class Scaled(nn.Module):
    def __init__(self, op, value: torch.Tensor, constant_first: bool = False) -> None:
        super().__init__()
        self.op, self.constant_first = op, constant_first
        self.register_buffer("c", value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self.c, x) if self.constant_first else self.op(x, self.c)


class WritesItsConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.c.add_(1.0)
        return x * self.c


def _numbers(ep) -> list:
    return [
        a
        for n in ep.graph.nodes
        if n.op == "call_function"
        for a in n.args
        if isinstance(a, (int, float))
    ]


@pytest.mark.parametrize(
    ("op", "value", "x", "inlined"),
    [
        (torch.mul, torch.tensor(0.125), torch.randn(3, 4), True),
        (torch.div, torch.tensor(3.0, dtype=torch.float64), torch.randn(3, 4), True),
        (torch.add, torch.tensor(7), torch.randint(-5, 5, (3, 4), dtype=torch.int32), True),
        (torch.sub, torch.tensor(1.5), torch.randn(3, 4), True),
        # an int tensor with a float constant: keep the tensor (the dtype logic stays ATen's)
        (torch.mul, torch.tensor(0.5), torch.randint(0, 9, (3, 4)), False),
        (torch.mul, torch.tensor(True), torch.randn(3, 4), False),
    ],
)
def test_scalar_operands_come_back_only_where_the_dtype_cannot_change(op, value, x, inlined):
    module = Scaled(op, value)
    ep = torch.export.export(module, (x,))
    want = module(x)
    count = inline_scalar_constants(ep)
    assert count == (1 if inlined else 0)
    assert _numbers(ep) == ([value.item()] if inlined else [])
    got = ep.module()(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_constant_first_operand_of_a_commutative_op():
    module = Scaled(torch.mul, torch.tensor(4.0), constant_first=True)
    x = torch.randn(2, 3)
    ep = torch.export.export(module, (x,))
    assert inline_scalar_constants(ep) == 1
    torch.testing.assert_close(ep.module()(x), module(x), rtol=0, atol=0)
    # not for the non-commutative ones: 4 - x is no x - 4
    module = Scaled(torch.sub, torch.tensor(4.0), constant_first=True)
    ep = torch.export.export(module, (x,))
    assert inline_scalar_constants(ep) == 0


def test_a_constant_the_program_writes_stays_a_tensor():
    ep = torch.export.export(WritesItsConstant(), (torch.randn(3),))
    assert inline_scalar_constants(ep) == 0


def test_the_pass_refuses_a_graph_not_of_its_program():
    x = torch.randn(2, 3)
    ep = torch.export.export(Scaled(torch.mul, torch.tensor(4.0)), (x,))
    other = torch.export.export(Scaled(torch.mul, torch.tensor(2.0)), (x,))
    with pytest.raises(ValueError, match="graph module of the ExportedProgram"):
        InlineScalarConstantsPass(ep)(other.graph_module)
    assert _numbers(other) == []  # nothing was rewritten
