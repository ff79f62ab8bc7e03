"""A method that is one delegate call, run on the caller's tensors.

Most Metal programs lower whole: the plan is a single ``DelegateCall`` taking the
method's inputs and producing its outputs. The general path copies every input into
planned memory, lets the delegate write the planned outputs, then clones them for the
caller: two copies of every tensor that change nothing visible. When the delegate
can return new output tensors (``BackendExecutor.execute_fresh``), such a method
passes inputs that already have the planned layout straight through and returns the
delegate's tensors as its outputs. Inputs of any other layout, dtype or shape go
through the same checks and copy as before, so results and errors are the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .backend_interface import BackendExecutor
from .errors import ExecutionError, InputError, instruction_failed
from .program_schema import schema
from .values import TensorInfo, ValueTable


class DirectDelegateCall:
    """Runs the method's only instruction, a delegate call, without planned-memory copies."""

    def __init__(
        self,
        name: str,
        inputs: list[tuple[int, TensorInfo]],
        outputs: list[int],
        values: list,
        executor: BackendExecutor,
        set_input,
        label: str,
    ) -> None:
        self._name = name
        self._label = label
        self._inputs = inputs
        self._planned_in = [values[i] for i, _ in inputs]
        self._planned_out = [values[i] for i in outputs]
        self._executor = executor
        self._set_input = set_input  # the general path's check-and-copy of one input

    @classmethod
    def for_plan(
        cls,
        plan: schema.ExecutionPlan,
        table: ValueTable,
        executors: Sequence[BackendExecutor],
        set_input,
    ) -> DirectDelegateCall | None:
        """The direct call of ``plan``, or None when it is not exactly one such call."""
        if len(plan.chains) != 1 or len(plan.chains[0].instructions) != 1:
            return None
        call = plan.chains[0].instructions[0].instr_args
        if not isinstance(call, schema.DelegateCall):
            return None
        if not 0 <= call.delegate_index < len(executors):
            return None
        executor = executors[call.delegate_index]
        if not getattr(executor, "supports_fresh_outputs", False):
            return None
        inputs, outputs = list(plan.inputs), list(plan.outputs)
        args = list(call.args)
        if args != inputs + outputs or len(set(args)) != len(args):
            return None
        if any(i not in table.tensors for i in args):  # tensors only
            return None
        return cls(
            plan.name,
            [(i, table.tensors[i]) for i in inputs],
            outputs,
            table.values,
            executor,
            set_input,
            f"instruction 0 (delegate {call.delegate_index})",
        )

    def prepare_fast(self, owner: object, guard: object, fallback) -> object | None:
        """The executor's prepared call for this method (``BackendExecutor.prepare_fresh``)
        or None: it serves inputs already laid out as planned under ``guard`` (the method's
        lock, with ``owner._owner`` set meanwhile) and calls ``fallback`` for the rest."""
        prepare = getattr(self._executor, "prepare_fresh", None)
        if prepare is None:
            return None
        return prepare(
            self._planned_in,
            self._planned_out,
            fallback=fallback,
            wrap=lambda exc: instruction_failed(self._name, self._label, 0, exc),
            guard=guard,
            guard_owner=owner,
        )

    def execute(self, inputs: Sequence) -> list:
        if not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        if len(inputs) != len(self._inputs):
            raise InputError(
                f"method {self._name!r} takes {len(self._inputs)} inputs, got {len(inputs)}"
            )
        args = []
        for pos, (src, dst) in enumerate(zip(inputs, self._planned_in)):
            if (
                isinstance(src, torch.Tensor)
                and src.dtype == dst.dtype
                and src.shape == dst.shape
                and src.stride() == dst.stride()
                and src.is_cpu
            ):
                args.append(src)  # already laid out as planned: no copy
            else:
                self._set_input(self._name, pos, self._inputs[pos][1], dst, src)
                args.append(dst)
        try:
            return self._executor.execute_fresh(args, self._planned_out)
        except ExecutionError:
            raise
        except (Exception, RecursionError) as exc:
            raise instruction_failed(self._name, self._label, 0, exc) from exc
