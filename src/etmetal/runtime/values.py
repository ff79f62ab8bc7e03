"""The value table of one method: EValues built from the program, tensors over planned memory.

Planned tensors are views into per-method arenas (one per ``non_const_buffer_sizes``
entry, ``mem_id`` 1-based as in the C++ runtime), so tensors the memory planner put at
the same offset really share bytes. Constants come from the constant segment or named
data; mutable buffers with initial state are copied into their planned place once, at
load, and then persist across executions.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import InvalidProgramError, ResourceLimitError
from .layout import SCALAR_TYPES, element_size, numel, strides_for
from .program_schema import schema

MEMORY_CAP_ENV = "ETMETAL_MAX_MEMORY"
MAX_DIMS = 16  # ExecuTorch's kTensorDimensionLimit


def default_memory_cap() -> int:
    """Bytes a method may allocate: ``$ETMETAL_MAX_MEMORY`` or half the physical memory."""
    env = os.environ.get(MEMORY_CAP_ENV)
    if env:
        return int(env)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 << 30


@dataclass
class TensorInfo:
    """What the program says about one tensor value."""

    dtype: torch.dtype
    sizes: list[int]  # upper bounds for dynamic shapes
    dim_order: list[int]
    dynamism: schema.TensorShapeDynamism
    nbytes: int
    kind: str  # constant | planned | mutable | external | unplanned
    capacity: int  # elements the tensor may grow to

    @property
    def is_static(self) -> bool:
        return self.dynamism == schema.TensorShapeDynamism.STATIC

    @property
    def is_memory_planned(self) -> bool:
        return self.kind in ("planned", "mutable")


@dataclass
class ValueTable:
    method: str
    values: list
    tensors: dict[int, TensorInfo] = field(default_factory=dict)
    # list values (IntList, TensorList, OptionalTensorList): the value indices they hold
    list_items: dict[int, list[int]] = field(default_factory=dict)
    arenas: list[torch.Tensor] = field(default_factory=list)


def _aligned_bytes(blob: bytes) -> torch.Tensor:
    """A private, aligned, writable uint8 tensor holding ``blob`` (storage not resizable)."""
    return torch.from_numpy(np.frombuffer(blob, dtype=np.uint8).copy())


class _Builder:
    def __init__(self, plan: schema.ExecutionPlan, data, memory_cap: int, allocate=None):
        self.plan = plan
        # planned buffers come from here (shared memory when delegates run isolated)
        self.allocate = allocate
        self.data = data
        self.name = plan.name
        self.memory_cap = memory_cap
        self.allocated = 0

    def fail(self, index: int, message: str) -> InvalidProgramError:
        return InvalidProgramError(f"method {self.name!r}: value {index}: {message}")

    def charge(self, nbytes: int, what: str) -> None:
        self.allocated += nbytes
        if self.allocated > self.memory_cap:
            raise ResourceLimitError(
                f"method {self.name!r}: {what} brings planned memory to {self.allocated} bytes, "
                f"over the cap of {self.memory_cap} bytes (set ${MEMORY_CAP_ENV} to raise it)"
            )

    def arenas(self) -> list[torch.Tensor]:
        sizes = list(self.plan.non_const_buffer_sizes or [])
        arenas: list[torch.Tensor] = []
        for mem_id, size in enumerate(sizes):
            if mem_id == 0:  # reserved for constants, as in the C++ runtime
                arenas.append(torch.empty(0, dtype=torch.uint8))
                continue
            if not isinstance(size, int) or size < 0:
                raise InvalidProgramError(
                    f"method {self.name!r}: planned buffer {mem_id} has invalid size {size!r}"
                )
            self.charge(size, f"planned buffer {mem_id} ({size} bytes)")
            # numpy zero-fills lazily; from_numpy storages cannot be resized, so a kernel
            # that grows an out tensor past the arena fails instead of reallocating it
            if self.allocate is not None:
                arenas.append(self.allocate(size))
            else:
                arenas.append(torch.from_numpy(np.zeros(size, dtype=np.uint8)))
        return arenas

    def tensor_info(self, index: int, t: schema.Tensor) -> TensorInfo:
        dtype = SCALAR_TYPES.get(int(t.scalar_type))
        if dtype is None:
            raise self.fail(index, f"unknown scalar type {t.scalar_type!r}")
        sizes = list(t.sizes)
        if len(sizes) > MAX_DIMS:
            raise self.fail(index, f"{len(sizes)} dims, over the runtime's limit of {MAX_DIMS}")
        if any((not isinstance(s, int)) or s < 0 for s in sizes):
            raise self.fail(index, f"invalid sizes {sizes}")
        dim_order = list(t.dim_order)
        if sorted(dim_order) != list(range(len(sizes))):
            raise self.fail(
                index, f"dim order {dim_order} is not a permutation of {len(sizes)} dims"
            )
        count = numel(sizes)
        nbytes = count * element_size(dtype)
        if nbytes > self.memory_cap:
            raise ResourceLimitError(
                f"method {self.name!r}: value {index}: tensor of sizes {sizes} needs {nbytes} "
                f"bytes, over the cap of {self.memory_cap} bytes"
            )
        extra = t.extra_tensor_info
        if extra is not None and extra.location == schema.TensorDataLocation.EXTERNAL:
            kind = "external"
        elif t.allocation_info is not None:
            kind = "mutable" if t.data_buffer_idx > 0 else "planned"
        elif t.data_buffer_idx > 0:
            kind = "constant"
        else:
            kind = "unplanned"
        try:
            dynamism = schema.TensorShapeDynamism(t.shape_dynamism)
        except ValueError:
            raise self.fail(index, f"unknown shape dynamism {t.shape_dynamism!r}") from None
        return TensorInfo(dtype, sizes, dim_order, dynamism, nbytes, kind, count)

    def place(self, index: int, info: TensorInfo, base: torch.Tensor, offset: int) -> torch.Tensor:
        """A tensor of ``info``'s layout at byte ``offset`` of ``base`` (a uint8 tensor)."""
        size = element_size(info.dtype)
        if offset % size:
            raise self.fail(
                index, f"byte offset {offset} is not aligned to its {size}-byte {info.dtype}"
            )
        strides = strides_for(info.sizes, info.dim_order)
        out = torch.empty(0, dtype=info.dtype)
        out.set_(
            base.untyped_storage(), (base.storage_offset() + offset) // size, info.sizes, strides
        )
        return out

    def blob_tensor(self, index: int, info: TensorInfo, blob: bytes, what: str) -> torch.Tensor:
        if len(blob) < info.nbytes:
            raise self.fail(index, f"{what} holds {len(blob)} bytes, tensor needs {info.nbytes}")
        return self.place(index, info, _aligned_bytes(blob[: info.nbytes]), 0)

    def planned(self, index: int, info: TensorInfo, t: schema.Tensor, arenas) -> torch.Tensor:
        alloc = t.allocation_info
        mem_id = alloc.memory_id
        if not 1 <= mem_id < len(arenas):
            raise self.fail(
                index,
                f"memory id {mem_id} is out of range (program plans {len(arenas) - 1} buffers)",
            )
        offset = alloc.memory_offset
        arena = arenas[mem_id]
        if offset + info.nbytes > arena.numel():
            raise self.fail(
                index,
                f"planned at offset {offset} of buffer {mem_id} with {info.nbytes} bytes, past "
                f"the buffer's {arena.numel()} bytes",
            )
        return self.place(index, info, arena, offset)

    def tensor(self, index: int, t: schema.Tensor, arenas) -> tuple[torch.Tensor, TensorInfo]:
        info = self.tensor_info(index, t)
        if info.kind == "external":
            key = t.extra_tensor_info.fully_qualified_name
            blob = self.data.named_data.get(key) if key else None
            if blob is None:
                raise self.fail(
                    index, f"external tensor {key!r} is in no data file (pass data_files=[...])"
                )
            if t.allocation_info is None:
                self.charge(info.nbytes, f"external tensor value {index} ({info.nbytes} bytes)")
                return self.blob_tensor(index, info, blob, f"named data {key!r}"), info
            out = self.planned(index, info, t, arenas)
            out.copy_(self.blob_tensor(index, info, blob, f"named data {key!r}"))
            return out, info
        if info.kind == "constant":
            idx = t.data_buffer_idx
            if idx >= len(self.data.constant_buffers):
                raise self.fail(
                    index,
                    f"constant buffer {idx} is out of range ({len(self.data.constant_buffers)} buffers)",
                )
            # constants are copied per method (aligned, private): they count against the cap
            self.charge(info.nbytes, f"constant tensor value {index} ({info.nbytes} bytes)")
            return self.blob_tensor(
                index, info, self.data.constant_buffers[idx], f"constant buffer {idx}"
            ), info
        if info.kind == "mutable":
            out = self.planned(index, info, t, arenas)
            idx = t.data_buffer_idx
            if idx >= len(self.data.mutable_buffers):
                raise self.fail(
                    index,
                    f"mutable buffer {idx} is out of range ({len(self.data.mutable_buffers)} buffers)",
                )
            init = self.blob_tensor(
                index, info, self.data.mutable_buffers[idx], f"mutable buffer {idx}"
            )
            out.copy_(init)
            return out, info
        if info.kind == "planned":
            return self.planned(index, info, t, arenas), info
        # not planned: the C++ runtime expects the caller to supply memory; own it instead
        self.charge(info.nbytes, f"unplanned tensor value {index}")
        base = torch.from_numpy(np.zeros(info.nbytes, dtype=np.uint8))
        return self.place(index, info, base, 0), info


def _scalar(index: int, val, method: str):
    if isinstance(val, schema.Int):
        return int(val.int_val)
    if isinstance(val, schema.Bool):
        return bool(val.bool_val)
    if isinstance(val, schema.Double):
        v = val.double_val
        if isinstance(v, str):
            if v not in ("inf", "-inf"):
                raise InvalidProgramError(f"method {method!r}: value {index}: bad double {v!r}")
            return math.inf if v == "inf" else -math.inf
        return float(v)
    if isinstance(val, schema.String):
        return str(val.string_val)
    return None


def build_values(
    plan: schema.ExecutionPlan, data, memory_cap: int | None = None, allocate=None
) -> ValueTable:
    cap = default_memory_cap() if memory_cap is None else memory_cap
    builder = _Builder(plan, data, cap, allocate)
    table = ValueTable(plan.name, [None] * len(plan.values))
    table.arenas = builder.arenas()
    n = len(plan.values)
    lists: list[tuple[int, object]] = []
    for index, evalue in enumerate(plan.values):
        val = evalue.val
        if isinstance(val, schema.Tensor):
            table.values[index], table.tensors[index] = builder.tensor(index, val, table.arenas)
        elif isinstance(val, (schema.IntList, schema.TensorList, schema.OptionalTensorList)):
            lists.append((index, val))
        elif isinstance(val, (schema.DoubleList, schema.BoolList)):
            conv = float if isinstance(val, schema.DoubleList) else bool
            table.values[index] = [conv(x) for x in val.items]
        elif isinstance(val, schema.Null) or val is None:
            table.values[index] = None
        elif isinstance(val, (schema.Int, schema.Bool, schema.Double, schema.String)):
            table.values[index] = _scalar(index, val, plan.name)
        else:
            raise builder.fail(index, f"unsupported value type {type(val).__name__}")
    for index, val in lists:
        items = [int(i) for i in val.items]
        optional = isinstance(val, schema.OptionalTensorList)
        want_tensor = not isinstance(val, schema.IntList)
        for i in items:
            if optional and i == -1:
                continue
            if not 0 <= i < n:
                raise builder.fail(index, f"list item {i} is out of range ({n} values)")
            item = plan.values[i].val
            if want_tensor and not isinstance(item, schema.Tensor):
                raise builder.fail(index, f"tensor list item {i} is a {type(item).__name__}")
            if not want_tensor and not isinstance(item, schema.Int):
                raise builder.fail(index, f"int list item {i} is a {type(item).__name__}")
        table.list_items[index] = items
        table.values[index] = [None if i == -1 else table.values[i] for i in items]
    return table


def describe_values(plan: schema.ExecutionPlan, data, indices: list[int]) -> ValueTable:
    """Tensor infos and scalar values of ``indices`` only, allocating no memory (metadata)."""
    builder = _Builder(plan, data, default_memory_cap())
    table = ValueTable(plan.name, [None] * len(plan.values))
    for index in indices:
        if not 0 <= index < len(plan.values):
            raise InvalidProgramError(
                f"method {plan.name!r}: input/output value index {index} is out of range "
                f"({len(plan.values)} values)"
            )
        val = plan.values[index].val
        if isinstance(val, schema.Tensor):
            table.tensors[index] = builder.tensor_info(index, val)
        else:
            table.values[index] = _scalar(index, val, plan.name)
    return table
