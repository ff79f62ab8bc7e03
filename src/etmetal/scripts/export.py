"""``etmetal export``: a model to a ``.pte`` lowered with the Metal partitioner.

MODEL is a registry name (``etmetal export --list``) or ``package.module:callable``,
where the callable returns an ``nn.Module`` (then give ``--input-shape``) or a
``(module, example_inputs)`` pair.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

from etmetal.backend.lowering import lower
from etmetal.common.targets import AUTO, HOST, MPS
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs


def resolve_model(spec: str, input_shapes: list[str]) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    if spec in REGISTRY:
        return get_model_and_inputs(spec)
    if ":" not in spec:
        raise SystemExit(
            f"etmetal export: {spec!r} is neither a registry name ({', '.join(REGISTRY)}) "
            "nor module:callable"
        )
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"etmetal export: cannot load {spec!r}: {exc}") from None
    made = factory()
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        return made[0], tuple(made[1])
    if not isinstance(made, torch.nn.Module):
        raise SystemExit(
            f"etmetal export: {spec} returned {type(made).__name__}; expected an nn.Module "
            "or a (module, example_inputs) pair"
        )
    if not input_shapes:
        raise SystemExit(
            f"etmetal export: {spec} returned a bare module; give its example inputs with "
            "--input-shape, e.g. --input-shape 1,3,224,224"
        )
    shapes = [tuple(int(d) for d in s.split(",")) for s in input_shapes]
    return made, tuple(torch.randn(*s) for s in shapes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="registry name or module:callable")
    parser.add_argument("-o", "--output", help="output .pte (default: <model>.pte)")
    parser.add_argument("--target", default=AUTO, choices=(AUTO, HOST.name, MPS.name))
    parser.add_argument(
        "--input-shape", action="append", default=[], help="example input shape, e.g. 1,3,8,8"
    )
    parser.add_argument("--runtime", choices=("etmetal", "upstream"), help="see MetalPartitioner")
    parser.add_argument("--codesign-identity", help="sign the .so on macOS ('-' = ad hoc)")
    parser.add_argument("--list", action="store_true", help="list the registry models")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each decision")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for entry in REGISTRY.values():
            print(f"{entry.name:34} {entry.description}")
        return 0
    if not args.model:
        print("etmetal export: give a MODEL (or --list)", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    logging.getLogger("etmetal.backend.aoti_compile").setLevel(logging.INFO)
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    specs = []
    if args.codesign_identity:
        specs.append(CompileSpec("codesign_identity", args.codesign_identity.encode()))
    module, inputs = resolve_model(args.model, args.input_shape)
    start = time.perf_counter()
    program, partitioner = lower(
        module, inputs, target=args.target, compile_specs=specs, runtime=args.runtime
    )
    elapsed = time.perf_counter() - start
    name = args.model.replace(":", "_").replace(".", "_")
    out = Path(args.output or f"{name}.pte")
    out.write_bytes(program.buffer)
    for report in partitioner.reports:
        print(report.text())
    delegates = [
        str(d.id) for plan in program.executorch_program.execution_plan for d in plan.delegates
    ]
    print(
        f"wrote {out} ({out.stat().st_size} bytes, {len(delegates)} MetalBackend delegate(s), "
        f"target {partitioner.target}) in {elapsed:.1f} s"
    )
    return 0
