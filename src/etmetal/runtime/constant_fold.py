"""Load-time folding of layout copies whose inputs are all constants.

An exported ``nn.Linear`` becomes ``permute_copy(weight)`` + ``addmm``: every execute
would transpose the same constant weight again (for a 1024 x 1024 weight that costs
more than the matmul on one thread). Such a copy has no side effects and its inputs
never change, so it runs once, at load, into a private tensor, and the instruction
leaves the hot loop. The result cannot stay in its planned slot: memory planning may
give those bytes to other values later in the method.

The emitter may also give one planned buffer several value slots: a view it removed (an
``expand_copy`` that changes nothing, a ``view_copy`` turned into an alias) leaves a
second tensor at the same bytes, and the next instruction reads that one. Moving the
copy's result to a private tensor would leave the alias reading whatever memory planning
put there before, so a copy whose bytes are read through another slot is not folded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .errors import InvalidProgramError
from .program_schema import schema
from .values import ValueTable

# out-variant layout copies: pure functions of their inputs
FOLDABLE = frozenset(
    {
        "aten::permute_copy.out",
        "aten::t_copy.out",
        "aten::transpose_copy.out",
        "aten::expand_copy.out",
        "aten::view_copy.out",
        "aten::clone.out",
        "dim_order_ops::_to_dim_order_copy.out",
    }
)

SplitArgs = Callable[[str, str, list[int]], tuple[list[int], list[int]]]


def _foldable(table: ValueTable, args: list[int], rets: list[int], keep: set[int]) -> bool:
    # the out argument is the return slot, and nothing the caller reads or a Move rewrites
    if len(rets) != 1 or not args or args[-1] != rets[0] or rets[0] in keep:
        return False
    out_info = table.tensors.get(rets[0])
    if out_info is None or not out_info.is_static or out_info.kind != "planned":
        return False
    tensors = [i for i in args[:-1] if i in table.tensors]
    if not tensors or any(table.tensors[i].kind != "constant" for i in tensors):
        return False
    # a tensor list argument could hold non-constant tensors
    return not any(j in table.tensors for i in args[:-1] for j in table.list_items.get(i, ()))


def _byte_range(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage pointer, first byte, end byte) of a planned tensor."""
    size = t.element_size()
    start = t.storage_offset() * size
    return t.untyped_storage().data_ptr(), start, start + t.numel() * size


def _covered(lo: int, hi: int, spans: list[tuple[int, int]]) -> bool:
    """Whether the byte spans cover all of [lo, hi)."""
    for a, b in sorted(spans):
        if a > lo:
            return False
        lo = max(lo, b)
        if lo >= hi:
            return True
    return lo >= hi


def _read_through_alias(
    table: ValueTable,
    later: list[tuple[list[int], list[int], bool]],
    out: int,
) -> bool:
    """Whether an instruction after the copy reads, through another slot, bytes of ``out``
    that no instruction has overwritten since (then that slot holds the copy's result).

    Memory planning hands the bytes of a dead value to later ones, so a later value over
    the same bytes is normal; it only matters when it is read before being written."""
    vals = table.values
    storage, lo, hi = _byte_range(vals[out])
    moved: set[int] = set()  # slots a Move rewrote: they hold another value now
    written: list[tuple[int, int]] = []  # bytes of [lo, hi) kernels overwrote since the copy
    for args, rets, writes_bytes in later:
        # a tuple return (``native_layer_norm.out``) is the list of the out tensors it wrote
        rets = [*rets, *(j for i in rets for j in table.list_items.get(i, ()) if j >= 0)]
        # a tensor-list argument (``cat``) reads its items
        items = [j for i in args for j in table.list_items.get(i, ()) if j >= 0]
        for i in [*args, *items]:
            if i == out or i in moved or i in rets:
                continue
            info = table.tensors.get(i)
            v = vals[i]
            if info is None or info.kind != "planned" or not isinstance(v, torch.Tensor):
                continue
            s, a, b = _byte_range(v)
            a, b = max(a, lo), min(b, hi)
            if s == storage and a < b and not _covered(a, b, written):
                return True
        if not writes_bytes:
            moved.update(rets)
            continue
        for i in rets:
            v = vals[i]
            if table.tensors.get(i) is not None and isinstance(v, torch.Tensor):
                s, a, b = _byte_range(v)
                if s == storage and max(a, lo) < min(b, hi):
                    written.append((max(a, lo), min(b, hi)))
        if _covered(lo, hi, written):
            return False  # every byte of the copy's result is overwritten: nothing reads it
    return False


def fold_constants(
    plan: schema.ExecutionPlan,
    table: ValueTable,
    kernels: dict[int, Callable],
    kernel_names: dict[int, str],
    split_args: SplitArgs,
    dynamic: set[int],
) -> set[tuple[int, int]]:
    """Run the foldable instructions now; returns their (chain, instruction) positions.

    ``dynamic``: value slots whose identity changes while the method runs (left alone).
    Chains with jumps are left alone too (an instruction there may run zero or many times).
    """
    folded: set[tuple[int, int]] = set()
    keep = set(plan.outputs) | dynamic
    vals = table.values
    for ci, chain in enumerate(plan.chains):
        if any(isinstance(i.instr_args, schema.JumpFalseCall) for i in chain.instructions):
            continue
        # (read, written) value slots of each instruction and whether it writes the written
        # slots' bytes (a kernel) or only rebinds them (a Move), for the alias check
        slots: list[tuple[list[int], list[int], bool]] = []
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            if isinstance(a, schema.KernelCall):
                args, rets = split_args(
                    f"chain {ci} instruction {ii}", kernel_names[a.op_index], list(a.args)
                )
                slots.append((args, rets, True))
            elif isinstance(a, schema.DelegateCall):
                slots.append((list(a.args), [], True))
            elif isinstance(a, schema.MoveCall):
                slots.append(([a.move_from], [a.move_to], False))
            else:
                slots.append(([], [], True))
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            if not isinstance(a, schema.KernelCall) or kernel_names[a.op_index] not in FOLDABLE:
                continue
            name = kernel_names[a.op_index]
            args, rets = split_args(f"chain {ci} instruction {ii}", name, list(a.args))
            if not _foldable(table, args, rets, keep):
                continue
            if _read_through_alias(table, slots[ii + 1 :], rets[0]):
                continue
            out = rets[0]
            planned = vals[out]
            private = torch.empty_strided(planned.shape, planned.stride(), dtype=planned.dtype)
            try:
                kernels[a.op_index](*[private if i == out else vals[i] for i in args])
            except Exception as exc:
                raise InvalidProgramError(
                    f"method {plan.name!r}: chain {ci} instruction {ii} ({name}) on constant "
                    f"inputs failed at load: {type(exc).__name__}: {exc}"
                ) from exc
            vals[out] = private
            table.tensors[out].kind = "constant"
            folded.add((ci, ii))
    return folded
