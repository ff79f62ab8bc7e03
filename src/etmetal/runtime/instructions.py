"""Turning a method's instructions into prepared steps, once, at load.

Each instruction becomes a zero-argument callable with its kernel resolved and its
arguments bound: values whose identity never changes (planned tensors, constants,
literal scalars and lists) are bound directly; only slots that instructions overwrite
(``MoveCall`` targets, scalar results of ``executorch_prim`` ops) are read from the value
table at call time. The execute loop is then a flat walk over a list of callables.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .backend_interface import BackendExecutor, BackendInitContext
from .constant_fold import fold_constants
from .delegates import lookup_delegate
from .errors import (
    DelegateError,
    EtmetalRuntimeError,
    InvalidProgramError,
    MissingDelegateError,
    MissingKernelError,
)
from .kernels import registry
from .program_schema import schema
from .values import ValueTable

Step = Callable[[], object]


@dataclass
class Chain:
    steps: list[Step]
    labels: list[str]  # what each step is, for error messages
    jumps: list[bool]  # step returns the next instruction index
    has_jumps: bool


@dataclass
class PreparedMethod:
    chains: list[Chain]
    executors: list[BackendExecutor] = field(default_factory=list)
    # tensors whose shape may change; checked against their planned capacity after each step
    dynamic_tensors: bool = False


def _noop() -> None:
    return None


def op_name(op: schema.Operator) -> str:
    return f"{op.name}.{op.overload}" if op.overload else op.name


class _Preparer:
    def __init__(self, plan: schema.ExecutionPlan, table: ValueTable, program, context_factory):
        self.plan = plan
        self.table = table
        self.vals = table.values
        self.program = program
        self.context_factory = context_factory
        self.name = plan.name
        self.n = len(table.values)
        self.dynamic: set[int] = set()

    def fail(self, where: str, message: str) -> InvalidProgramError:
        return InvalidProgramError(f"method {self.name!r}: {where}: {message}")

    def check_index(self, where: str, index: int, what: str = "value") -> int:
        if not isinstance(index, int) or not 0 <= index < self.n:
            raise self.fail(where, f"{what} index {index} is out of range ({self.n} values)")
        return index

    # -- kernel resolution ------------------------------------------------------------
    def resolve_kernels(self) -> dict[int, Callable]:
        ops = self.plan.operators
        used: dict[int, str] = {}
        for ci, chain in enumerate(self.plan.chains):
            for ii, instr in enumerate(chain.instructions):
                args = instr.instr_args
                if isinstance(args, schema.KernelCall):
                    if not 0 <= args.op_index < len(ops):
                        raise self.fail(
                            f"chain {ci} instruction {ii}",
                            f"operator index {args.op_index} is out of range ({len(ops)} operators)",
                        )
                    used[args.op_index] = op_name(ops[args.op_index])
        kernels: dict[int, Callable] = {}
        missing = set()
        for index, name in used.items():
            kernel = registry.lookup(name)
            if kernel is None:
                missing.add(name)
            else:
                kernels[index] = kernel
        if missing:
            raise MissingKernelError(self.name, sorted(missing))
        return kernels

    # -- which value slots change identity while the method runs ----------------------
    def split_args(self, where: str, name: str, args: list[int]) -> tuple[list[int], list[int]]:
        """(arguments, return slots) of a KernelCall."""
        n_args = registry.num_arguments(name)
        if n_args is not None:
            # the emitter appends return slots even for ops whose schema returns ()
            if len(args) < n_args:
                raise self.fail(
                    where, f"{name} takes {n_args} arguments, the instruction has {len(args)} slots"
                )
            n_ret = len(args) - n_args
        else:
            n_ret = registry.num_returns(name)
            if n_ret is None:
                # no schema: trailing slots that repeat the ones before them are returns
                n_ret = 0
                for k in range(len(args) // 2, 0, -1):
                    if args[-k:] == args[-2 * k : -k]:
                        n_ret = k
                        break
            if n_ret > len(args):
                raise self.fail(
                    where, f"{name} has {n_ret} return slots, the instruction has {len(args)} slots"
                )
        return args[: len(args) - n_ret], args[len(args) - n_ret :]

    def find_dynamic(self, kernel_names: dict[int, str]) -> None:
        for ci, chain in enumerate(self.plan.chains):
            for ii, instr in enumerate(chain.instructions):
                a = instr.instr_args
                where = f"chain {ci} instruction {ii}"
                if isinstance(a, schema.MoveCall):
                    self.dynamic.add(self.check_index(where, a.move_to, "move target"))
                elif isinstance(a, schema.KernelCall):
                    for i in a.args:
                        self.check_index(where, i, "argument")
                    args, rets = self.split_args(where, kernel_names[a.op_index], list(a.args))
                    for r in rets:
                        if self.is_scalar_slot(r):
                            self.dynamic.add(r)

    def is_scalar_slot(self, index: int) -> bool:
        """A return slot the kernel's Python return value is stored into."""
        return not isinstance(self.vals[index], (torch.Tensor, list))

    def getter(self, index: int):
        """(static value, None) or (None, callable returning the value at call time)."""
        vals = self.vals
        items = self.table.list_items.get(index)
        if index in self.dynamic:
            return None, lambda: vals[index]
        if items is not None and any(i in self.dynamic for i in items):
            return None, lambda: [None if i == -1 else vals[i] for i in items]
        return vals[index], None

    def bind(self, indices: list[int]) -> tuple[list, list[tuple[int, Callable]]]:
        static, dyn = [], []
        for pos, index in enumerate(indices):
            value, get = self.getter(index)
            static.append(value)
            if get is not None:
                dyn.append((pos, get))
        return static, dyn

    # -- steps ------------------------------------------------------------------------
    def capacity_checks(self, indices: list[int]) -> list[tuple[torch.Tensor, int, int]]:
        checks = []
        for i in indices:
            info = self.table.tensors.get(i)
            if info is not None and not info.is_static and info.kind != "constant":
                checks.append((self.vals[i], info.capacity, i))
        return checks

    def kernel_step(self, where: str, name: str, kernel, a: schema.KernelCall) -> Step:
        args, rets = self.split_args(where, name, list(a.args))
        extra = [r for r in rets if r not in args and isinstance(self.vals[r], torch.Tensor)]
        # a scalar return slot may also be an argument (``i = add(i, 1)`` in loops)
        scalar_rets = [r for r in rets if self.is_scalar_slot(r)]
        call_indices = args + extra
        static, dyn = self.bind(call_indices)
        checks = self.capacity_checks(call_indices)
        vals = self.vals
        ret = scalar_rets[0] if len(scalar_rets) == 1 else None
        if len(scalar_rets) > 1:
            raise self.fail(
                where, f"{name}: {len(scalar_rets)} scalar return slots are not supported"
            )

        if not dyn and ret is None and not checks:
            return functools.partial(kernel, *static)
        static_t = tuple(static)

        def step():
            if dyn:
                call = list(static_t)
                for pos, get in dyn:
                    call[pos] = get()
            else:
                call = static_t
            result = kernel(*call)
            if ret is not None:
                vals[ret] = result
            for t, cap, i in checks:
                if t.numel() > cap:
                    raise ValueError(
                        f"value {i} grew to shape {list(t.shape)} ({t.numel()} elements), past "
                        f"its planned capacity of {cap} elements"
                    )

        return step

    def delegate_step(self, where: str, a: schema.DelegateCall, executors) -> Step:
        if not 0 <= a.delegate_index < len(executors):
            raise self.fail(
                where,
                f"delegate index {a.delegate_index} is out of range ({len(executors)} delegates)",
            )
        for i in a.args:
            self.check_index(where, i, "argument")
        executor = executors[a.delegate_index]
        static, dyn = self.bind(list(a.args))
        try:
            executor.check_call(list(static))
        except EtmetalRuntimeError:
            raise
        except Exception as exc:
            raise self.fail(where, f"delegate {a.delegate_index} refused its call: {exc}") from exc
        checks = self.capacity_checks(list(a.args))

        def step():
            call = list(static)
            for pos, get in dyn:
                call[pos] = get()
            executor.execute(call)
            for t, cap, i in checks:
                if t.numel() > cap:
                    raise ValueError(
                        f"delegate output value {i} grew past its capacity of {cap} elements"
                    )

        return step

    def jump_step(self, where: str, a: schema.JumpFalseCall, n_instr: int) -> Step:
        cond = self.check_index(where, a.cond_value_index, "condition")
        dest = a.destination_instruction
        if not 0 <= dest <= n_instr:  # == n_instr jumps to the end of the chain
            raise self.fail(
                where, f"jump destination {dest} is out of range ({n_instr} instructions)"
            )
        vals = self.vals
        label = where

        def step(pc: int) -> int:
            c = vals[cond]
            if isinstance(c, torch.Tensor):
                if c.dtype != torch.bool:
                    raise ValueError(
                        f"{label}: condition tensor has dtype {c.dtype}, expected bool"
                    )
                ok = bool(c.all())
            elif isinstance(c, bool):
                ok = c
            else:
                raise ValueError(
                    f"{label}: condition value {cond} is a {type(c).__name__}, not a bool"
                )
            return pc + 1 if ok else dest

        return step

    def move_step(self, where: str, a: schema.MoveCall) -> Step:
        frm = self.check_index(where, a.move_from, "move source")
        to = a.move_to
        vals = self.vals

        def step():
            vals[to] = vals[frm]

        return step

    def free_step(self, where: str, a: schema.FreeCall) -> Step:
        index = self.check_index(where, a.value_index, "free target")
        if not isinstance(self.vals[index], torch.Tensor):
            raise self.fail(where, f"FreeCall target {index} is not a tensor")
        # memory is planned per method: nothing to release, the slot is simply dead
        return _noop

    def init_delegates(self) -> list[BackendExecutor]:
        executors: list[BackendExecutor] = []
        inline = self.program.backend_delegate_data or []
        try:
            for di, delegate in enumerate(self.plan.delegates or []):
                where = f"delegate {di} ({delegate.id!r})"
                cls = lookup_delegate(delegate.id)
                if cls is None:
                    raise MissingDelegateError(
                        f"method {self.name!r}: {where}: no delegate registered for backend "
                        f"{delegate.id!r} (register one under the 'executorch.runtime.delegates' "
                        "entry-point group)"
                    )
                ref = delegate.processed
                if ref.location != schema.DataLocation.INLINE or not 0 <= ref.index < len(inline):
                    raise self.fail(
                        where, f"processed data {ref.index} is out of range ({len(inline)} blobs)"
                    )
                specs = [(cs.key, bytes(cs.value)) for cs in delegate.compile_specs or []]
                context = self.context_factory(self.name)
                host = context.options.get("isolation_host")
                try:
                    if host is not None:  # the delegate lives in the worker process
                        executor = host.init(cls, context, bytes(inline[ref.index].data), specs)
                    else:
                        executor = cls.init(context, bytes(inline[ref.index].data), specs)
                except EtmetalRuntimeError:
                    raise
                except Exception as exc:
                    raise DelegateError(
                        f"method {self.name!r}: {where}: init failed: {type(exc).__name__}: {exc}"
                    ) from exc
                executors.append(executor)
        except BaseException:
            destroy_all(executors)
            raise
        return executors

    def prepare(self) -> PreparedMethod:
        kernels = self.resolve_kernels()
        kernel_names = {i: op_name(self.plan.operators[i]) for i in kernels}
        self.find_dynamic(kernel_names)
        for i in list(self.plan.inputs) + list(self.plan.outputs):
            self.check_index("inputs/outputs", i)
        self.folded = fold_constants(
            self.plan, self.table, kernels, kernel_names, self.split_args, self.dynamic
        )
        executors = self.init_delegates()
        try:
            chains = [
                self.prepare_chain(ci, c, kernels, kernel_names, executors)
                for ci, c in enumerate(self.plan.chains)
            ]
        except BaseException:
            destroy_all(executors)
            raise
        dynamic = any(not info.is_static for info in self.table.tensors.values())
        return PreparedMethod(chains, executors, dynamic)

    def prepare_chain(self, ci, chain, kernels, kernel_names, executors) -> Chain:
        steps, labels, jumps = [], [], []
        n_instr = len(chain.instructions)
        for ii, instr in enumerate(chain.instructions):
            a = instr.instr_args
            where = f"chain {ci} instruction {ii}"
            if (ci, ii) in self.folded:  # ran once at load (constant_fold.py)
                steps.append(_noop)
                labels.append(f"instruction {ii} (folded at load)")
            elif isinstance(a, schema.KernelCall):
                name = kernel_names[a.op_index]
                steps.append(self.kernel_step(where, name, kernels[a.op_index], a))
                labels.append(f"instruction {ii} ({name})")
            elif isinstance(a, schema.DelegateCall):
                steps.append(self.delegate_step(where, a, executors))
                labels.append(f"instruction {ii} (delegate {a.delegate_index})")
            elif isinstance(a, schema.JumpFalseCall):
                steps.append(self.jump_step(where, a, n_instr))
                labels.append(f"instruction {ii} (JumpFalse)")
            elif isinstance(a, schema.MoveCall):
                steps.append(self.move_step(where, a))
                labels.append(f"instruction {ii} (Move)")
            elif isinstance(a, schema.FreeCall):
                steps.append(self.free_step(where, a))
                labels.append(f"instruction {ii} (Free)")
            else:
                raise self.fail(where, f"unknown instruction type {type(a).__name__}")
            jumps.append(isinstance(a, schema.JumpFalseCall))
        has_jumps = any(jumps)
        if not has_jumps:  # straight-line code: drop no-ops from the hot loop
            keep = [i for i, s in enumerate(steps) if s is not _noop]
            steps = [steps[i] for i in keep]
            labels = [labels[i] for i in keep]
            jumps = [False] * len(steps)
        return Chain(steps, labels, jumps, has_jumps)


def destroy_all(executors: list[BackendExecutor]) -> None:
    for executor in reversed(executors):
        # destroy runs during cleanup; one failure must not skip the rest
        with contextlib.suppress(Exception):
            executor.destroy()
    executors.clear()


def prepare_method(
    plan, table, program, context_factory: Callable[[str], BackendInitContext]
) -> PreparedMethod:
    return _Preparer(plan, table, program, context_factory).prepare()
