"""The proxy executor: ``aoti_torch_proxy_executor_call_function`` over the torch dispatcher.

An AOTI ``.so`` calls the proxy executor for every operator Inductor left to ATen that has
no C shim (custom ops, ATen ops missing from torch's C-shim ABI). It passes the index of
the operator in the model's *extern-node table* (the JSON Inductor writes next to the
wrapper) and the operator's arguments flattened into two arrays: the integers and the
tensor handles. Which schema argument each element belongs to is known only from the
table: tensors (``as_tensor``, ``as_tensors``, the present items of ``as_optional_tensors``)
and integers (``as_int``/``as_sym_int``, ``as_ints``/``as_sym_ints``) are passed at run
time, in the order of the serialized inputs, followed by one tensor handle per tensor the
operator returns (and one integer per integer it returns); everything else (floats, bools,
strings, dtypes, ``None``) is in the table. This is how torch's own ``OSSProxyExecutor``
reads them.

Each call checks what the ``.so`` passed against the table before anything runs: the
node index, the number of integers and tensors its schema takes, and each tensor's dtype
against the dtype the compiled model gave it (etmetal records those in the table's node
metadata at compile time). Inputs reach the operator as ATen views of the shim storage
(no copy; an operator that mutates an argument writes the shim memory). Each result is
adopted without a copy into the output handle the ``.so`` passed (AOTI creates those with
``aoti_torch_new_uninitialized_tensor``), as ``*tensor = result`` does in libtorch.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from etmetal.common.delegate_blobs import EXTERN_NODE_DTYPES_KEY
from etmetal.shims.abi_codes import DTYPE_TO_TORCH
from etmetal.shims.tensor_shims import adopt_result

from . import extern_ops
from .extern_ops import ExternNodeError
from .registry import ShimTable, read_i64s
from .storage import ShimError

if TYPE_CHECKING:
    from .context import ShimContext

# this module's shims: registered on a context by whoever builds it, never on import
SHIMS = ShimTable()
shim = SHIMS.shim

# node metadata key etmetal's compile writes: tensor name -> dtype name (``float32``)
DTYPES_METADATA_KEY = EXTERN_NODE_DTYPES_KEY

# serialized kinds whose values the .so passes at run time
_TENSOR_KINDS = ("as_tensor", "as_tensors", "as_optional_tensors")
_INT_KINDS = ("as_int", "as_sym_int", "as_ints", "as_sym_ints")


@dataclass(frozen=True)
class _Arg:
    """Where one schema argument's value comes from."""

    name: str
    kind: str  # "static", "tensor", "tensors", "optional_tensors", "int", "ints"
    value: Any = None  # the static value
    length: int = 1  # elements taken from the flattened arrays
    present: tuple[bool, ...] = ()  # optional_tensors: which items are tensors


@dataclass(frozen=True)
class ExternNode:
    """One operator of the table, resolved against its schema."""

    index: int
    target: str
    op: torch._ops.OpOverload
    args: tuple[_Arg, ...]
    n_ints: int  # integers the .so passes: dynamic inputs + integer outputs
    n_tensors: int  # tensor handles the .so passes: inputs + outputs
    n_input_tensors: int
    returns: tuple[tuple[str, int], ...]  # per schema return: ("tensor"|"tensors"|"none"|"int", n)
    dtypes: tuple[torch.dtype | None, ...]  # per flattened tensor (inputs, then outputs)
    tensor_names: tuple[str, ...]

    def describe(self) -> str:
        return f"extern node {self.index} ({self.target})"


def _static(key: str, value: Any, where: str) -> Any:
    from torch._export.serde.serialize import (
        _SERIALIZE_TO_TORCH_DTYPE,
        _SERIALIZE_TO_TORCH_LAYOUT,
        _SERIALIZE_TO_TORCH_MEMORY_FORMAT,
    )

    if key == "as_none":
        return None
    if key in ("as_float", "as_bool", "as_string"):
        return value
    if key in ("as_floats", "as_bools", "as_strings"):
        return list(value)
    if key == "as_scalar_type":
        return _SERIALIZE_TO_TORCH_DTYPE[value]
    if key == "as_memory_format":
        return _SERIALIZE_TO_TORCH_MEMORY_FORMAT[value]
    if key == "as_layout":
        return _SERIALIZE_TO_TORCH_LAYOUT[value]
    if key == "as_device":
        # the operator runs on ATen's CPU kernels over the shim memory (mps storage is host
        # memory too), whatever device the graph named
        return torch.device("cpu")
    raise ExternNodeError(f"{where}: argument kind {key!r} is not supported by the proxy executor")


def _names(key: str, value: Any) -> list[str]:
    """The tensor names a serialized tensor argument passes, in order."""
    if key == "as_tensor":
        return [value["name"]]
    if key == "as_tensors":
        return [v["name"] for v in value]
    return [v["as_tensor"]["name"] for v in value if "as_tensor" in v]  # as_optional_tensors


def _resolve(target: object, where: str) -> torch._ops.OpOverload:
    """The overload ``target`` names, if the allow-list (:mod:`.extern_ops`) lets the
    table call it; every failure is an ``ExternNodeError``."""
    if not isinstance(target, str):
        raise ExternNodeError(f"{where}: target {target!r} is not a string")
    namespace, sep, rest = target.partition("::")
    name, dot, overload = rest.partition(".")
    parts = (namespace, name) + ((overload,) if dot else ())  # "op." has an empty overload
    # identifiers only, and no dunders: the name is looked up as attributes of torch.ops
    if not sep or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        raise ExternNodeError(
            f"{where}: target {target!r} is not 'namespace::name[.overload]' of identifiers"
        )
    try:
        # the schema from the dispatcher's registry: no torch.ops attribute is touched for
        # a name the process does not have
        schema = torch._C._get_schema(f"{namespace}::{name}", overload)
    except Exception:  # RuntimeError for an unknown name, whatever else a binding raises
        raise ExternNodeError(
            f"{where}: operator {target} is not registered in this process; import the module "
            "that defines it (torch.library) before loading the model"
        ) from None
    why = extern_ops.refusal(namespace, name, overload, schema)
    if why is not None:
        raise ExternNodeError(
            f"{where}: operator {target} is not on the proxy executor's allow-list: {why}"
        )
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except Exception:
        op = None
    if not isinstance(op, torch._ops.OpOverload):
        raise ExternNodeError(f"{where}: operator {target} has no callable overload")
    return op


def _parse_node(index: int, entry: dict) -> ExternNode:
    where = f"extern node {index}"
    try:
        node = entry["node"]
        target = node["target"]
        inputs, outputs = node["inputs"], node["outputs"]
        metadata = node.get("metadata") or {}
    except (KeyError, TypeError):
        raise ExternNodeError(f"{where}: not a serialized extern kernel node") from None
    where = f"{where} ({target})"
    op = _resolve(target, where)
    schema = op._schema
    by_name = {a.name: a for a in schema.arguments}
    dtype_names = json.loads(metadata.get(DTYPES_METADATA_KEY, "{}"))
    args: list[_Arg] = []
    names: list[str] = []
    n_ints = 0
    for item in inputs:
        name, arg = item.get("name"), item.get("arg")
        if name not in by_name or not isinstance(arg, dict) or len(arg) != 1:
            raise ExternNodeError(f"{where}: input {name!r} does not match the schema {schema}")
        ((key, value),) = arg.items()
        if key in _TENSOR_KINDS:
            found = _names(key, value)
            names += found
            kind = {"as_tensor": "tensor", "as_tensors": "tensors"}.get(key, "optional_tensors")
            present = tuple("as_tensor" in v for v in value) if kind == "optional_tensors" else ()
            args.append(_Arg(name, kind, None, len(found), present))
        elif key in _INT_KINDS:
            single = key in ("as_int", "as_sym_int")
            if not single and not isinstance(value, list):
                raise ExternNodeError(
                    f"{where}: input {name!r}: {key} holds {type(value).__name__}, not a list"
                )
            n = 1 if single else len(value)
            n_ints += n
            args.append(_Arg(name, "int" if single else "ints", None, n))
        else:
            args.append(_Arg(name, "static", _static(key, value, where), 0))
    given = {item.get("name") for item in inputs}
    missing = [
        a.name for a in schema.arguments if a.name not in given and not a.has_default_value()
    ]
    if missing:  # refused now rather than at the first call
        raise ExternNodeError(
            f"{where}: the table gives no value for argument {missing[0]!r}, which has no "
            f"default in the schema {schema}"
        )
    n_inputs = len(names)
    returns: list[tuple[str, int]] = []
    if len(outputs) != len(schema.returns):
        raise ExternNodeError(
            f"{where}: {len(outputs)} serialized outputs, the schema {schema} returns "
            f"{len(schema.returns)}"
        )
    for out in outputs:
        ((key, value),) = out.items()
        if key == "as_optional_tensor":
            ((key, value),) = value.items()
        if key in ("as_tensor", "as_tensors"):
            found = _names(key, value)
            names += found
            returns.append(("tensor" if key == "as_tensor" else "tensors", len(found)))
        elif key == "as_none":
            returns.append(("none", 0))
        elif key == "as_int":
            n_ints += 1
            returns.append(("int", 1))
        else:
            raise ExternNodeError(f"{where}: output kind {key!r} is not supported")
    if not isinstance(dtype_names, dict):
        raise ExternNodeError(f"{where}: {DTYPES_METADATA_KEY} is not an object")
    dtypes = tuple(_dtype(dtype_names[n], where) if n in dtype_names else None for n in names)
    return ExternNode(
        index, target, op, tuple(args), n_ints, len(names), n_inputs, tuple(returns), dtypes,
        tuple(names),
    )  # fmt: skip


def _dtype(name: object, where: str) -> torch.dtype:
    value = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise ExternNodeError(f"{where}: {name!r} is not a torch dtype")
    return value


def parse_extern_nodes(text: str | bytes) -> tuple[ExternNode, ...]:
    """The operators of a serialized extern-node table (``{"nodes": [...]}``).

    The table is the program's data, so any JSON may arrive: every way it can be wrong
    (nesting deeper than the parser recurses, values of the wrong type, targets outside
    the allow-list) is an ``ExternNodeError`` naming the node.
    """
    try:
        data = json.loads(text)
        entries = data["nodes"]
    except RecursionError:
        raise ExternNodeError("the extern-node table is nested too deeply to parse") from None
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ExternNodeError(
            f"the extern-node table is not valid JSON with 'nodes': {exc}"
        ) from None
    if not isinstance(entries, list):
        raise ExternNodeError("the extern-node table's 'nodes' is not a list")
    nodes = []
    for i, entry in enumerate(entries):
        try:
            nodes.append(_parse_node(i, entry))
        except ExternNodeError:
            raise
        except Exception as exc:  # a value of a type the format does not allow
            raise ExternNodeError(
                f"extern node {i}: malformed entry ({type(exc).__name__}: {exc})"
            ) from None
    return tuple(nodes)


class ProxyExecutor:
    """The operators of one model's extern-node table, run on ATen over shim storage."""

    def __init__(self, nodes: tuple[ExternNode, ...], device_type: int) -> None:
        self.nodes = nodes
        self.device_type = device_type  # the device results are made on (cpu or mps)
        self.calls = 0

    @classmethod
    def from_json(cls, text: str | bytes, device_type: int) -> ProxyExecutor:
        return cls(parse_extern_nodes(text), device_type)

    def node(self, index: int) -> ExternNode:
        if not 0 <= index < len(self.nodes):
            raise ShimError(
                f"extern node index {index} is out of range: the model's extern-node table "
                f"has {len(self.nodes)} node(s)"
            )
        return self.nodes[index]

    def call(self, ctx: ShimContext, index, num_ints, ints_ptr, num_tensors, tensors_ptr) -> None:
        node = self.node(index)
        if num_ints != node.n_ints or num_tensors != node.n_tensors:
            raise ShimError(
                f"{node.describe()}: got {num_ints} int(s) and {num_tensors} tensor(s), its "
                f"schema {node.op._schema} takes {node.n_ints} int(s) and {node.n_tensors} "
                "tensor(s) (inputs and outputs)"
            )
        ints = read_i64s(ints_ptr, num_ints, "flatten_int_args")
        handles = _read_handles(tensors_ptr, num_tensors)
        inputs = [ctx.lookup(h, f"{node.describe()} tensor {i}") for i, h in enumerate(handles)]
        for i, t in enumerate(inputs[: node.n_input_tensors]):
            self._check_dtype(node, i, DTYPE_TO_TORCH.get(t.dtype))
        outputs = handles[node.n_input_tensors :]
        for i, h in enumerate(outputs):  # checked before the operator runs
            ctx.lookup(h, f"{node.describe()} output {i}")
        args, kwargs = _bind(node, ints, [t.torch() for t in inputs[: node.n_input_tensors]])
        with torch.no_grad():
            result = node.op(*args, **kwargs)
        results = _flatten_returns(node, result)
        if len(results) != len(outputs):
            raise ShimError(
                f"{node.describe()} returned {len(results)} tensor(s) for {len(outputs)} output "
                "handle(s)"
            )
        taken = {t.storage.ptr for t in inputs}
        for i, (h, r) in enumerate(zip(outputs, results)):
            self._check_dtype(node, node.n_input_tensors + i, r.dtype, produced=True)
            current = inputs[node.n_input_tensors + i]
            if r.data_ptr() == current.data_ptr and _same_geometry(r, current):
                continue  # an in-place op returned the very tensor the handle names
            if r.untyped_storage().data_ptr() in taken:
                r = r.clone()  # an output aliasing an argument: the handle gets its own memory
            ctx.rebind(h, adopt_result(r, self.device_type), f"{node.describe()} output {i}")
        self.calls += 1

    @staticmethod
    def _check_dtype(node: ExternNode, i: int, got, produced: bool = False) -> None:
        expected = node.dtypes[i] if i < len(node.dtypes) else None
        if expected is None or got == expected:
            return
        name = node.tensor_names[i]
        what = "produced" if produced else "was passed"
        raise ShimError(
            f"{node.describe()}: tensor {i} ({name}) {what} with dtype {got}, the compiled "
            f"model expects {expected}"
        )


def _same_geometry(t: torch.Tensor, shim_tensor) -> bool:
    return (
        t.dtype == DTYPE_TO_TORCH.get(shim_tensor.dtype)
        and tuple(t.shape) == shim_tensor.sizes
        and tuple(t.stride()) == shim_tensor.strides
    )


def _read_handles(addr: int | None, n: int) -> list[int]:
    if n < 0:
        raise ShimError(f"num_tensors {n} is negative")
    if n == 0:
        return []
    if not addr:
        raise ShimError(f"flatten_tensor_args is NULL but {n} tensors were expected")
    return list((ctypes.c_void_p * n).from_address(addr))


def _bind(node: ExternNode, ints: tuple[int, ...], tensors: list[torch.Tensor]):
    """Positional and keyword arguments for ``node.op`` from the flattened arrays."""
    values: dict[str, Any] = {}
    ti = ii = 0
    for a in node.args:
        if a.kind == "static":
            values[a.name] = a.value
        elif a.kind == "tensor":
            values[a.name] = tensors[ti]
            ti += 1
        elif a.kind == "tensors":
            values[a.name] = tensors[ti : ti + a.length]
            ti += a.length
        elif a.kind == "optional_tensors":
            items = []
            for present in a.present:
                items.append(tensors[ti] if present else None)
                ti += present
            values[a.name] = items
        elif a.kind == "int":
            values[a.name] = ints[ii]
            ii += 1
        else:  # ints
            values[a.name] = list(ints[ii : ii + a.length])
            ii += a.length
    # every argument by name (the dispatcher binds positional ones by name too); the ones
    # the table leaves out take their schema defaults
    return [], values


def _flatten_returns(node: ExternNode, result: Any) -> list[torch.Tensor]:
    """The tensors ``result`` holds for the output handles, in order."""
    returns = node.returns
    if not returns:
        return []
    parts = [result] if len(returns) == 1 else list(result)
    out: list[torch.Tensor] = []
    for (kind, n), value in zip(returns, parts):
        if kind == "tensor" and n:
            out.append(value)
        elif kind == "tensors":
            out.extend(value)
    for r in out:
        if not isinstance(r, torch.Tensor):
            raise ShimError(f"{node.describe()} returned {type(r).__name__}, not a tensor")
    return out


@shim
def aoti_torch_proxy_executor_call_function(
    ctx, proxy, extern_node_index, num_ints, flatten_int_args, num_tensors, flatten_tensor_args
):
    executor = ctx.proxy_executor(proxy)
    executor.call(
        ctx, extern_node_index, num_ints, flatten_int_args, num_tensors, flatten_tensor_args
    )
