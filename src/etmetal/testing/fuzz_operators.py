"""Fuzz family ``operators``: programs whose operator tables name random operators.

Each case edits the portable ``x + 1`` program (:mod:`.hostile_programs`) so an
instruction calls an operator drawn from four pools: names of the kernel table,
``torch.ops`` names outside it, operators with file, process or unchecked-memory side
effects, and names that are not operator names at all (dunders, empty parts, huge or
non-ASCII strings). The arguments are random slots of the program, among them a path
inside the case's own sandbox directory. A quarter of the cases instead give the proxy
executor an extern-node table naming such an operator.

The oracle is independent of the runtime's lookup: a name outside the checked-in lists
(ExecuTorch's kernel libraries, Core ATen out variants, the deliberate extras) and the
kernels registered at start must be refused
at load with ``MissingKernelError`` naming it; a table name may load and run or fail
with an etmetal error; an extern-node table naming a dangerous operator must be an
``ExternNodeError``; and no case may leave a file in its sandbox. Outcomes are the
campaign's: ``error``, ``ran``, ``correct``, ``BAD``.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import tempfile
import traceback
from pathlib import Path

import torch
from executorch.exir import schema
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

from . import hostile_programs as hostile

SUBKINDS = ("rename", "call", "append", "extern")

DANGEROUS = (
    "aten::from_file", "aten::from_file.out", "aten::save", "aten::set_.source_Storage",
    "aten::set_.source_Storage_storage_offset", "aten::set_.source_Tensor",
    "inductor::_reinterpret_tensor", "debugprims::load_tensor", "aten::_unsafe_view",
    "aten::manual_seed", "aten::_print", "prims::as_strided", "aten::as_strided_",
    "profiler::_record_function_enter", "aten::_nested_view_from_buffer",
    "aten::set_grad_enabled", "aten::record_stream", "aten::warn",
)  # fmt: skip
GARBAGE = (
    "__class__::__init__.__call__", "aten::__getattribute__", "aten::add.__class__", "",
    "::", "aten::", "aten::add.", ".out", "aten::add.out.out", "a" * 5000 + "::b.out",
    "\u00e9t::op.out", "os::system", "builtins::open", "aten::add\x00.out", "aten :: add",
    "torch::ops", "_ops::__dict__",
)  # fmt: skip


class Pools:
    """The operator names a case draws from, fixed once per worker."""

    def __init__(self) -> None:
        from etmetal.runtime.kernels import registry, table

        # the checked-in lists (tested against the stock registry and torch's tags) and
        # the kernels registered at start, not the runtime's lookup
        self.allowed = frozenset(
            set(table.STOCK_OPERATORS)
            | set(table.CORE_ATEN_OUT_VARIANTS)
            | set(table.EXTRA_OPERATORS)
            | set(registry.registered_names())
        )
        torch_names = sorted(torch._C._dispatch_get_all_op_names())
        self.table = sorted(self.allowed)
        self.outside = [n for n in torch_names if n not in self.allowed]

    def draw(self, rng: random.Random) -> str:
        r = rng.random()
        if r < 0.35:
            return rng.choice(self.table)
        if r < 0.7:
            return rng.choice(self.outside)
        if r < 0.85:
            return rng.choice(DANGEROUS)
        return rng.choice(GARBAGE)


def _split(name: str) -> tuple[str, str]:
    """(operator name, overload) as a program spells them: the overload after the first
    dot past the namespace."""
    ns, sep, rest = name.partition("::")
    op, dot, overload = rest.partition(".")
    return (f"{ns}{sep}{op}", overload) if dot else (name, "")


def _random_values(plan: schema.ExecutionPlan, rng: random.Random, sandbox: Path) -> list[int]:
    """Slot indices for a random call: the program's own, new scalars, a sandbox path."""
    base = len(plan.values)
    plan.values += [
        schema.EValue(schema.String(str(sandbox / f"f{rng.randrange(1000)}"))),
        schema.EValue(schema.Bool(rng.random() < 0.5)),
        schema.EValue(schema.Int(rng.choice([0, 1, 4, -1, 1 << 20, 1 << 62]))),
        schema.EValue(schema.Double(rng.choice([0.0, 1.5, -2.0, float("nan")]))),
        schema.EValue(schema.Null()),
    ]
    n = len(plan.values)
    pool = list(range(n)) + [base] * 3  # the path often
    args = [rng.choice(pool) for _ in range(rng.randint(0, 10))]
    if args and rng.random() < 0.05:
        args[rng.randrange(len(args))] = rng.choice([n, n + 7, -1, (1 << 31) - 1])  # int32 slots
    if rng.random() < 0.8 and args:
        args[-1] = plan.outputs[0]  # a return slot most ops take
    return args


def build_program(name: str, sub: str, rng: random.Random, sandbox: Path) -> bytes:
    op_name, overload = _split(name)
    if sub == "rename":
        return hostile.renamed_add(op_name, overload)
    parsed = copy.deepcopy(deserialize_pte_binary(hostile.x_plus_one()))
    plan = parsed.program.execution_plan[0]
    args = _random_values(plan, rng, sandbox)
    operator = schema.Operator(name=op_name, overload=overload)
    if sub == "call":  # the add instruction calls the drawn operator instead
        [index] = [i for i, op in enumerate(plan.operators) if op.name == "aten::add"]
        plan.operators[index] = operator
        for instr in plan.chains[0].instructions:
            a = instr.instr_args
            if isinstance(a, schema.KernelCall) and a.op_index == index:
                a.args = args
    else:  # one more instruction at the end
        plan.operators.append(operator)
        call = schema.KernelCall(op_index=len(plan.operators) - 1, args=args)
        plan.chains[0].instructions.append(schema.Instruction(call))
    return bytes(serialize_pte_binary(parsed))


def run_program(pools: Pools, name: str, data: bytes) -> tuple[str, str]:
    from etmetal.runtime import EtmetalRuntimeError, MissingKernelError, Runtime

    spelled = "{}.{}".format(*_split(name)) if _split(name)[1] else name
    try:
        method = Runtime.get().load_program(data).load_method("forward")
    except MissingKernelError as exc:
        if spelled in pools.allowed and spelled not in exc.operators:
            return "BAD", f"{spelled!r} refused but another name reported: {exc.operators}"
        return "error", f"MissingKernelError: {spelled[:80]!r}"
    except EtmetalRuntimeError as exc:
        return "error", f"{type(exc).__name__}: {exc}"[:200]
    if spelled not in pools.allowed:
        return "BAD", f"{spelled[:200]!r} is outside the kernel table and loaded"
    x = torch.randn(4)
    try:
        outputs = method.execute([x])
    except EtmetalRuntimeError as exc:
        return "error", f"{type(exc).__name__}: {exc}"[:200]
    finally:
        method.destroy()
    same = spelled == "aten::add.out" and torch.allclose(outputs[0], x + 1)
    return ("correct" if same else "ran"), spelled[:80]


def run_extern(name: str, rng: random.Random, sandbox: Path) -> tuple[str, str]:
    from etmetal.shims.abi_codes import DEVICE_CPU
    from etmetal.shims.proxy_executor import ExternNodeError, ProxyExecutor

    inputs = [
        {"name": "filename", "arg": {"as_string": str(sandbox / "t")}},
        {"name": "self", "arg": {"as_tensor": {"name": "a"}}},
        {"name": "size", "arg": {"as_int": 4}},
    ]
    node = {"target": name, "inputs": rng.sample(inputs, rng.randint(0, 3)), "outputs": []}
    if rng.random() < 0.5:
        node["outputs"] = [{"as_tensor": {"name": "b"}}]
    try:
        ProxyExecutor.from_json(json.dumps({"nodes": [{"node": node}]}), DEVICE_CPU)
    except ExternNodeError as exc:
        return "error", f"ExternNodeError: {exc}"[:200]
    if name in DANGEROUS or name in GARBAGE:
        return "BAD", f"the proxy executor accepted {name[:200]!r}"
    return "ran", name[:80]


def run_case(pools: Pools, rng: random.Random, case: int) -> tuple[str, str, str]:
    sub = SUBKINDS[case % len(SUBKINDS)]
    name = pools.draw(rng)
    sandbox = Path(tempfile.mkdtemp(prefix="etmetal-fuzz-ops-"))
    try:
        try:
            if sub == "extern":
                outcome, detail = run_extern(name, rng, sandbox)
            else:
                outcome, detail = run_program(pools, name, build_program(name, sub, rng, sandbox))
        except BaseException as exc:  # noqa: BLE001 - anything else is a finding
            tb = " ".join(t.strip() for t in traceback.format_exception(exc)[-3:])
            outcome, detail = "BAD", f"{type(exc).__name__}: {exc} | {tb}"[:500]
        made = sorted(p.name for p in sandbox.iterdir())
        if made:
            outcome, detail = "BAD", f"{name[:80]!r} created {made[:3]}"
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)
    return f"operators:{sub}", outcome, detail
