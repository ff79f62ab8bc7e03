"""Where a program's work runs: per method, its delegate calls and the operators left to the
runtime's kernels. ``etmetal run`` prints it before running, the ``.pte``-side half of the
partition report ``etmetal export`` prints (a ``.pte`` does not record *why* an operator
stayed out; :attr:`MetalPartitioner.report` does, at lowering)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def _target(delegate: Any) -> str | None:
    # the compile spec MetalPartitioner writes (backend/targets.py TARGET_SPEC_KEY); spelled
    # here so that running a program never imports the ahead-of-time package
    for spec in delegate.compile_specs or []:
        if spec.key == "target":
            return bytes(spec.value).decode("utf-8", "replace")
    return None


def plan_summary(plan: Any) -> str:
    """One line for one execution plan (method) of a deserialized program."""
    delegates: Counter[tuple[str, str | None]] = Counter()
    kernels: Counter[str] = Counter()
    for chain in plan.chains:
        for instruction in chain.instructions:
            args = instruction.instr_args
            if hasattr(args, "delegate_index"):
                d = plan.delegates[args.delegate_index]
                delegates[(str(d.id), _target(d))] += 1
            elif hasattr(args, "op_index"):
                op = plan.operators[args.op_index]
                kernels[f"{op.name}.{op.overload}" if op.overload else op.name] += 1
    counted = ", ".join(f"{name} x{n}" for name, n in sorted(kernels.items()))
    calls = sum(delegates.values())
    if calls:
        where = "; ".join(
            f"{name} x{n}" + (f", target {target}" if target else "")
            for (name, target), n in delegates.items()
        )
        text = f"method {plan.name!r}: {calls} delegate call(s) ({where})"
    else:
        text = f"method {plan.name!r}: no delegate"
    if kernels:
        text += f"; {sum(kernels.values())} operator call(s) outside delegates: {counted}"
        if calls:  # the .pte does not say why; the report made at lowering does
            text += " (why each stayed out: the partition report of etmetal export)"
    return text
