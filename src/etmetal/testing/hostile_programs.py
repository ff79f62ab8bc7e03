"""Hostile programs built by editing a lowered ``x + 1``: what a user might be handed.

The edits reach into the program the way an attacker's tool would (exir's own
serializer, no etmetal code): rename an operator of the operator table, or point the
add instruction at an operator with file side effects (``aten::from_file`` creating a
file through a shared mapping). Tests and the fuzz campaign use them to check that
etmetal's runtime refuses such programs at load, before anything runs.
"""

from __future__ import annotations

import copy
import functools

import torch
from executorch.exir import schema
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary


class _AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@functools.lru_cache(maxsize=1)
def x_plus_one() -> bytes:
    """A portable (undelegated) ``.pte`` computing ``x + 1`` for a float tensor of 4."""
    from executorch.exir import to_edge

    ep = torch.export.export(_AddOne(), (torch.randn(4),), strict=False)
    return bytes(to_edge(ep).to_executorch().buffer)


def _edit(pte: bytes, fn) -> bytes:
    parsed = copy.deepcopy(deserialize_pte_binary(pte))
    fn(parsed.program.execution_plan[0])
    return bytes(serialize_pte_binary(parsed))


def _add_index(plan: schema.ExecutionPlan) -> int:
    [index] = [i for i, op in enumerate(plan.operators) if op.name == "aten::add"]
    return index


def renamed_add(name: str, overload: str = "out", pte: bytes | None = None) -> bytes:
    """``x + 1`` whose operator table names ``name.overload`` where it said ``aten::add.out``
    (the instruction's arguments unchanged)."""

    def edit(plan: schema.ExecutionPlan) -> None:
        op = plan.operators[_add_index(plan)]
        op.name, op.overload = name, overload

    return _edit(pte or x_plus_one(), edit)


def _from_file_values(plan: schema.ExecutionPlan, path: str, size: int) -> tuple[int, int]:
    """Append ``aten::from_file``'s argument values (filename, shared=True, size, None) to
    ``plan``; returns the index of the first and of the None."""
    base = len(plan.values)
    plan.values += [
        schema.EValue(schema.String(path)),
        schema.EValue(schema.Bool(True)),
        schema.EValue(schema.Int(size)),
        schema.EValue(schema.Null()),
    ]
    return base, base + 3


def from_file_program(path: str, size: int = 4) -> bytes:
    """``x + 1`` rewritten so its add instruction calls ``aten::from_file(path, shared=True,
    size=size)`` into the output: run by a runtime that resolves any ``torch.ops`` name,
    it creates ``path`` (a shared mapping of ``size`` floats)."""

    def edit(plan: schema.ExecutionPlan) -> None:
        index = _add_index(plan)
        plan.operators[index] = schema.Operator(name="aten::from_file", overload="")
        base, null = _from_file_values(plan, path, size)
        [out] = plan.outputs
        for instr in plan.chains[0].instructions:
            args = instr.instr_args
            if isinstance(args, schema.KernelCall) and args.op_index == index:
                # filename, shared, size, dtype, layout, device, pin_memory, return slot
                args.args = [base, base + 1, base + 2, null, null, null, null, out]

    return _edit(x_plus_one(), edit)


def appended_from_file(pte: bytes, path: str, size: int = 4) -> bytes:
    """Any program with one more instruction at the end of its first chain: a call of
    ``aten::from_file(path, shared=True, size=size)`` into the method's first output.
    On a delegated program it checks the portable half of an isolated method."""

    def edit(plan: schema.ExecutionPlan) -> None:
        plan.operators.append(schema.Operator(name="aten::from_file", overload=""))
        base, null = _from_file_values(plan, path, size)
        call = schema.KernelCall(
            op_index=len(plan.operators) - 1,
            args=[base, base + 1, base + 2, null, null, null, null, plan.outputs[0]],
        )
        plan.chains[0].instructions.append(schema.Instruction(call))

    return _edit(pte, edit)
