"""``Method``: one loaded execution plan, ready to execute, and its metadata."""

from __future__ import annotations

import functools
import os
import threading
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .direct_delegate import DirectDelegateCall
from .errors import ExecutionError, InputError, instruction_failed
from .instructions import PreparedMethod, destroy_all
from .layout import resize_in_dim_order
from .program_schema import schema
from .values import TensorInfo, ValueTable

# a method whose jumps never reach its end is a hang; bound the steps per execute
MAX_STEPS_ENV = "ETMETAL_MAX_STEPS"
MAX_STEPS_PER_EXECUTE = int(os.environ.get(MAX_STEPS_ENV, 10_000_000))


@dataclass(frozen=True)
class TensorSpec:
    """The declared layout of an input or output tensor (sizes are upper bounds if dynamic)."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    shape_dynamism: schema.TensorShapeDynamism
    nbytes: int
    is_memory_planned: bool

    @classmethod
    def from_info(cls, info: TensorInfo) -> TensorSpec:
        return cls(
            info.dtype,
            tuple(info.sizes),
            tuple(info.dim_order),
            info.dynamism,
            info.nbytes,
            info.is_memory_planned,
        )


@dataclass(frozen=True)
class ValueSpec:
    """An input or output of a method: a tensor (``tensor`` set) or a scalar kind."""

    kind: str  # tensor | int | float | bool | str | none | list
    tensor: TensorSpec | None = None
    value: object = None  # the traced value of a scalar input


def _spec(table: ValueTable, index: int) -> ValueSpec:
    info = table.tensors.get(index)
    if info is not None:
        return ValueSpec("tensor", TensorSpec.from_info(info))
    v = table.values[index]
    kind = {bool: "bool", int: "int", float: "float", str: "str", type(None): "none"}.get(
        type(v), "list"
    )
    return ValueSpec(kind, None, v)


class MethodMeta:
    """Mirrors ``executorch.runtime``'s method metadata."""

    def __init__(self, plan: schema.ExecutionPlan, table: ValueTable):
        self._name = plan.name
        self.input_specs: tuple[ValueSpec, ...] = tuple(_spec(table, i) for i in plan.inputs)
        self.output_specs: tuple[ValueSpec, ...] = tuple(_spec(table, i) for i in plan.outputs)
        self.memory_planned_buffer_sizes: tuple[int, ...] = tuple(plan.non_const_buffer_sizes[1:])
        self.backends: tuple[str, ...] = tuple(d.id for d in plan.delegates or [])

    def name(self) -> str:
        return self._name

    def num_inputs(self) -> int:
        return len(self.input_specs)

    def num_outputs(self) -> int:
        return len(self.output_specs)

    def input_tensor_meta(self, index: int) -> TensorSpec | None:
        return self.input_specs[index].tensor

    def output_tensor_meta(self, index: int) -> TensorSpec | None:
        return self.output_specs[index].tensor

    def num_memory_planned_buffers(self) -> int:
        return len(self.memory_planned_buffer_sizes)

    def memory_planned_buffer_size(self, index: int) -> int:
        return self.memory_planned_buffer_sizes[index]

    def uses_backend(self, backend_id: str) -> bool:
        return backend_id in self.backends

    def __repr__(self) -> str:
        return f"MethodMeta(name={self._name!r}, inputs={self.input_specs}, outputs={self.output_specs})"


def _set_input(name: str, pos: int, info: TensorInfo | None, dst, src) -> None:
    if info is None:  # scalar or None input: must equal the traced value, as in C++
        if dst is None:
            if src is not None:
                raise InputError(
                    f"method {name!r}: input {pos} must be None, got {type(src).__name__}"
                )
            return
        if type(src) is not type(dst) and not (
            isinstance(dst, float) and isinstance(src, int) and not isinstance(src, bool)
        ):
            raise InputError(
                f"method {name!r}: input {pos} must be a {type(dst).__name__}, got {type(src).__name__}"
            )
        if src != dst and not (isinstance(dst, float) and abs(src - dst) <= 1e-4 + 1e-5 * abs(dst)):
            raise InputError(
                f"method {name!r}: input {pos} was traced as {dst!r}; the program cannot take {src!r}"
            )
        return
    if not isinstance(src, torch.Tensor):
        raise InputError(f"method {name!r}: input {pos} must be a tensor, got {type(src).__name__}")
    if src.dtype != dst.dtype:
        raise InputError(
            f"method {name!r}: input {pos} must have dtype {dst.dtype}, got {src.dtype}"
        )
    if src.shape != dst.shape:
        if src.dim() != dst.dim():
            raise InputError(
                f"method {name!r}: input {pos} must be {dst.dim()}-D {list(info.sizes)}, got shape {list(src.shape)}"
            )
        if info.is_static:
            raise InputError(
                f"method {name!r}: input {pos} has static shape {list(info.sizes)}, got {list(src.shape)}"
            )
        if src.numel() > info.capacity:
            raise InputError(
                f"method {name!r}: input {pos} of shape {list(src.shape)} ({src.numel()} elements) "
                f"exceeds its upper bound {list(info.sizes)} ({info.capacity} elements)"
            )
        resize_in_dim_order(dst, src.shape, info.capacity, info.dim_order)
    dst.copy_(src)


def _release(executors, isolation) -> None:
    destroy_all(executors)
    if isolation is not None:
        isolation.close()


class Method:
    """A loaded method. ``execute(inputs)`` runs it and returns its outputs as a list."""

    def __init__(
        self,
        plan: schema.ExecutionPlan,
        table: ValueTable,
        prepared: PreparedMethod,
        isolation=None,
    ):
        self._name = plan.name
        self._table = table
        self._vals = table.values
        self._prepared = prepared
        self._inputs = [(i, table.tensors.get(i)) for i in plan.inputs]
        self._outputs = list(plan.outputs)
        self._meta = MethodMeta(plan, table)
        self._chains = prepared.chains
        self.isolation = isolation  # the IsolationHost of isolated delegates, or None
        # one execute at a time: inputs, planned memory and outputs are per method
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._finalizer = weakref.finalize(self, _release, prepared.executors, isolation)
        self._destroyed = False
        # a method that is one delegate call skips the planned-memory copies
        self._direct = DirectDelegateCall.for_plan(plan, table, prepared.executors, _set_input)

    @property
    def _direct(self) -> DirectDelegateCall | None:
        return self._direct_call

    @_direct.setter
    def _direct(self, direct: DirectDelegateCall | None) -> None:
        """Set the direct call, and let its executor's prepared call (if it has one) serve
        ``execute``; None: the general path, alone. The prepared call holds this method
        weakly (no cycle, so a dropped method is freed at once); ``execute`` stays a method
        of the class, so ``load_method(...).execute(...)`` keeps the method alive."""
        self._direct_call = direct
        self._fast_execute = None
        if direct is not None:
            self._fast_execute = direct.prepare_fast(
                self, self._lock, functools.partial(_execute_by_ref, weakref.ref(self))
            )

    @property
    def name(self) -> str:
        return self._name

    @property
    def metadata(self) -> MethodMeta:
        return self._meta

    def destroy(self) -> None:
        """Release the delegates now (also happens when the method is garbage collected)."""
        self._destroyed = True
        self._finalizer()

    def set_inputs(self, inputs: Sequence) -> None:
        if not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        if len(inputs) != len(self._inputs):
            raise InputError(
                f"method {self._name!r} takes {len(self._inputs)} inputs, got {len(inputs)}"
            )
        vals = self._vals
        for pos, ((index, info), src) in enumerate(zip(self._inputs, inputs)):
            _set_input(self._name, pos, info, vals[index], src)

    def outputs(self) -> list:
        out = []
        for i in self._outputs:
            v = self._vals[i]
            out.append(v.clone() if isinstance(v, torch.Tensor) else v)
        return out

    def execute(self, inputs: Sequence = ()) -> list:
        """Run once. Calls from several threads are serialized (each gets its own outputs);
        a re-entrant call from inside this method's own execute is refused."""
        fast = self._fast_execute
        if fast is not None:
            return fast(inputs)
        return self._execute_serialized(inputs)

    def _execute_serialized(self, inputs: Sequence = ()) -> list:
        me = threading.get_ident()
        if self._owner == me:
            raise ExecutionError(
                f"method {self._name!r} is already executing on this thread (re-entrant "
                "execute, e.g. from a delegate); load a second Method for nested use",
                method=self._name,
            )
        with self._lock:
            self._owner = me
            try:
                return self._execute(inputs)
            finally:
                self._owner = None

    def _execute(self, inputs: Sequence) -> list:
        if self._destroyed:
            raise ExecutionError(f"method {self._name!r} was destroyed", method=self._name)
        if self._direct is not None:
            return self._direct.execute(inputs)
        self.set_inputs(inputs)
        if self._prepared.dynamic_tensors:
            with warnings.catch_warnings():
                # ATen warns when it resizes a non-empty out tensor; for dynamic shapes that
                # is the point (the runtime checks the planned capacity itself)
                warnings.filterwarnings(
                    "ignore", message="An output with one or more elements was resized"
                )
                self._run()
        else:
            self._run()
        return self.outputs()

    __call__ = execute

    def _run(self) -> None:
        for chain in self._chains:
            steps = chain.steps
            i = 0
            try:
                if not chain.has_jumps:
                    for step in steps:
                        step()
                        i += 1
                else:
                    jumps = chain.jumps
                    n = len(steps)
                    budget = MAX_STEPS_PER_EXECUTE
                    while i < n:
                        if jumps[i]:
                            i = steps[i](i)
                        else:
                            steps[i]()
                            i += 1
                        budget -= 1
                        if not budget:
                            raise ExecutionError(
                                f"method {self._name!r}: no exit after {MAX_STEPS_PER_EXECUTE} steps "
                                f"(a JumpFalse loop never ends; ${MAX_STEPS_ENV} raises the bound)",
                                method=self._name,
                            )
            except ExecutionError:
                raise
            except (Exception, RecursionError) as exc:
                label = chain.labels[i] if i < len(chain.labels) else f"instruction {i}"
                raise instruction_failed(self._name, label, i, exc) from exc


def _execute_by_ref(ref: weakref.ref, *args, **kwargs) -> list:
    """``Method.execute`` of the method ``ref`` names: a prepared call's fallback, which
    holds its method weakly (the method holds the call)."""
    method = ref()
    if method is None:
        raise ExecutionError("the method was garbage collected")
    return Method._execute_serialized(method, *args, **kwargs)
