"""The closed kernel table: which operator names a program may call.

The stock ExecuTorch runtime can run only the kernels its build registered, so a program
cannot name its way to an arbitrary operator. etmetal's runtime keeps that property: an
operator runs only when

- ExecuTorch's own kernel libraries provide it (:data:`STOCK_OPERATORS`, generated from
  the stock runtime's operator registry and the kernel yaml files the executorch package
  ships; ``python -m etmetal.runtime.kernels.table --check`` compares, ``--write``
  regenerates);
- it is the out variant of a Core ATen operator (:data:`CORE_ATEN_OUT_VARIANTS`,
  generated from torch's ``core`` operator tag): the opset ExecuTorch's edge dialect is
  defined over, pure computations into their ``out`` tensors, which a program the Metal
  partitioner partly delegates may leave to the portable side (``sort.values``);
- :data:`EXTRA_OPERATORS` names it on purpose;
- a kernel is registered for it by name: etmetal's own families (``prim``,
  ``dim_order``, ``quantized``, ``view_copy``, ``max_pool``, ``cortex_m``), the
  ``executorch.runtime.kernels`` entry point, or ``register_kernel`` /
  ``allow_torch_operator`` called by the user.

Names in the first group without a registered kernel run torch's own implementation of
the same overload (``torch.ops``), which has the same semantics as ExecuTorch's kernel
for it. Every other name is refused when the method loads (``MissingKernelError``).
Nothing here looks an operator up by a name the program chose unless the table
already holds that name.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .stock_operators import CORE_ATEN_OUT_VARIANTS, STOCK_OPERATORS

# Operators outside both generated sets that etmetal's runtime runs through torch on
# purpose: pure out variants over their tensor arguments, each here because ExecuTorch's
# backend conformance suite lowers a case to it (the stock runtime fails that case for
# want of a kernel, etmetal's passed it before the table was closed).
EXTRA_OPERATORS: frozenset[str] = frozenset(
    {
        "aten::adaptive_max_pool3d.out",  # suite: test_adaptive_maxpool3d
    }
)

# The yaml files of ExecuTorch's kernel libraries (paths inside the executorch package).
KERNEL_YAMLS = (
    "kernels/portable/functions.yaml",
    "kernels/portable/custom_ops.yaml",
    "kernels/portable/et_copy_ops.yaml",
    "kernels/quantized/quantized.yaml",
)

_GENERATED = Path(__file__).with_name("stock_operators.py")


def in_table(name: str) -> bool:
    """True when the table holds ``name`` without anyone registering a kernel for it."""
    return name in STOCK_OPERATORS or name in CORE_ATEN_OUT_VARIANTS or name in EXTRA_OPERATORS


def yaml_operator_names() -> set[str]:
    """Operator names the shipped kernel yaml files declare (``op:`` or ``func:`` entries)."""
    import executorch
    import yaml

    found: set[str] = set()
    for root in executorch.__path__:
        for rel in KERNEL_YAMLS:
            path = Path(root) / rel
            if not path.is_file():
                continue
            for entry in yaml.safe_load(path.read_text()) or []:
                if "op" in entry:  # an ATen operator by its ATen name
                    name = str(entry["op"])
                else:  # a schema: "[ns::]name.overload(args) -> ret"
                    name = str(entry["func"]).split("(", 1)[0].strip()
                found.add(name if "::" in name else f"aten::{name}")
    return found


def stock_registry_names() -> set[str]:
    """What the stock runtime's operator registry holds in this installation."""
    from executorch.runtime import Runtime

    return set(Runtime.get().operator_registry.operator_names)


def generate() -> list[str]:
    return sorted(stock_registry_names() | yaml_operator_names())


def core_aten_out_variants(exclude: frozenset[str] = frozenset()) -> list[str]:
    """``aten`` overloads with a keyword-only mutable ``out`` argument whose operator torch
    tags ``core`` (on any overload), minus ``exclude``."""
    import torch

    found = []
    for full in torch_names("aten::"):
        base, dot, overload = full.partition(".")
        if not dot or full in exclude:
            continue
        try:
            packet = getattr(torch.ops.aten, base.removeprefix("aten::"))
            op = getattr(packet, overload)
            tagged = any(torch.Tag.core in getattr(packet, o).tags for o in packet.overloads())
        except (AttributeError, RuntimeError):
            continue
        writes_out = any(
            a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
            for a in op._schema.arguments
        )
        if tagged and writes_out:
            found.append(full)
    return sorted(found)


def torch_names(prefix: str) -> list[str]:
    import torch

    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))


def _set_literal(name: str, names: list[str]) -> list[str]:
    return [f"{name}: frozenset[str] = frozenset(", "    {", *(f'        "{n}",' for n in names),
            "    }", ")", ""]  # fmt: skip


def _render(names: list[str], core: list[str]) -> str:
    lines = [
        '"""Operator names of the closed kernel table (generated; do not edit by hand).',
        "",
        "``STOCK_OPERATORS``: the stock runtime's operator registry",
        "(``executorch.runtime.Runtime.get().operator_registry.operator_names``) together",
        "with the operators the kernel yaml files of the executorch package declare.",
        "``CORE_ATEN_OUT_VARIANTS``: out variants of operators torch tags ``core``, not",
        "already in the first set. Regenerate with",
        "``python -m etmetal.runtime.kernels.table --write``.",
        '"""',
        "",
        *_set_literal("STOCK_OPERATORS", names),
        *_set_literal("CORE_ATEN_OUT_VARIANTS", core),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--write", action="store_true", help="regenerate stock_operators.py")
    parser.add_argument("--check", action="store_true", help="exit 1 if it is out of date")
    args = parser.parse_args(argv)
    names = generate()
    core = core_aten_out_variants(frozenset(names))
    if args.write:
        _GENERATED.write_text(_render(names, core))
        print(f"wrote {len(names)} + {len(core)} names to {_GENERATED}")
        return 0
    stale = (set(names) ^ STOCK_OPERATORS) | (set(core) ^ CORE_ATEN_OUT_VARIANTS)
    print(f"{len(names) + len(core)} names; {len(stale)} differ from stock_operators.py")
    for name in sorted(stale):
        print(f"    {name}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
