"""``etmetal run model.pte``: run a program in etmetal's runtime (or, with ``--native``, in
ExecuTorch's own C++ runtime through ``etmetal_runner``, a process without Python).

Inputs come from ``--inputs`` files (``.pt`` tensors saved with ``torch.save``, or ``.npy``)
or, when none are given, are random tensors shaped like the method's input specs: floats
normal, integers in ``[0, INDEX_BOUND)`` so that token ids, positions and gather indices are
in range for any table with at least that many rows. Prints where the program's work runs
(delegate calls, operators outside them), each output's shape, dtype and summary
statistics, and the execute latency.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

# random integer inputs are drawn from [0, INDEX_BOUND): valid as indices (embedding rows,
# KV-cache positions) in any model whose tables have at least this many entries
INDEX_BOUND = 8

_EPILOG = (
    "Without --inputs, inputs are random and shaped like the method's input specs: floats "
    f"from a normal distribution, integers (token ids, positions, indices) in [0, {INDEX_BOUND}), "
    "booleans 0/1. Give --inputs for a model whose integer inputs need other values."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = _EPILOG
    parser.add_argument("program", help="the .pte file")
    parser.add_argument("--method", default="forward", help="method to run (default: forward)")
    parser.add_argument("--inputs", nargs="*", default=None, help=".pt or .npy file per input")
    parser.add_argument("--data", nargs="*", default=None, help="external .ptd data files")
    parser.add_argument("--runs", type=int, default=10, help="timed executions (default 10)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for the random inputs (see below)"
    )
    parser.add_argument(
        "--trust-native-code",
        action="store_true",
        help="allow delegates that run native code shipped inside the program",
    )
    parser.add_argument(
        "--trust-hash",
        action="append",
        default=[],
        metavar="DIGEST",
        help="trust the delegate with this digest (printed when one is refused); repeatable",
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="run delegates in a worker process: a crashing delegate is an error, not a crash",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="run in ExecuTorch's C++ runtime (etmetal_runner, no Python in that process) "
        "with etmetal's native MetalBackend; built on first use",
    )
    parser.add_argument(
        "--etdump", default=None, metavar="FILE", help="with --native: write an ETDump here"
    )


def random_input(spec, generator: torch.Generator):
    """A value matching one input spec: tensors random (at their upper-bound shape)."""
    if spec.tensor is None:
        return spec.value  # scalars must equal the traced value
    t = spec.tensor
    shape = list(t.sizes)
    if t.dtype == torch.bool:
        value = torch.randint(0, 2, shape, generator=generator).bool()
    elif t.dtype.is_floating_point:
        value = torch.randn(shape, generator=generator, dtype=torch.float32).to(t.dtype)
    elif t.dtype.is_complex:
        value = torch.randn(shape, generator=generator, dtype=t.dtype)
    else:  # integers are most often indices: non-negative and small
        high = min(torch.iinfo(t.dtype).max + 1, INDEX_BOUND)
        value = torch.randint(0, high, shape, generator=generator, dtype=torch.int64).to(t.dtype)
    order = list(t.dim_order)
    if order != sorted(order):  # lay the input out the way the program expects it
        value = (
            value.permute(order).contiguous().permute([order.index(i) for i in range(len(order))])
        )
    return value


def load_input(path: str):
    p = Path(path)
    if p.suffix == ".npy":
        import numpy as np

        return torch.from_numpy(np.load(p))
    return torch.load(p, weights_only=True)


def describe(value) -> str:
    if not isinstance(value, torch.Tensor):
        return f"{type(value).__name__} {value!r}"
    text = f"{value.dtype} {list(value.shape)}"
    if value.numel() and (value.dtype.is_floating_point or not value.dtype.is_complex):
        v = value.detach().to(torch.float64)
        text += f"  min {v.min().item():.6g}  max {v.max().item():.6g}  mean {v.mean().item():.6g}"
    return text


def _where_it_runs(path: str, method: str) -> str:
    from etmetal.runtime.loader import load_program_data
    from etmetal.scripts.program_summary import plan_summary

    plans = {p.name: p for p in load_program_data(path).program.execution_plan}
    return plan_summary(plans[method])


def run_native(args: argparse.Namespace) -> int:
    from etmetal.stock_runtime.runner import NativeRunError, run_runner

    if args.isolate:
        print("etmetal run: --isolate does not apply to --native", file=sys.stderr)
        return 2
    inputs = [load_input(p) for p in args.inputs] if args.inputs else None
    try:
        result = run_runner(
            args.program,
            inputs,
            args.method,
            data_files=args.data or (),
            generate=None if inputs else f"seed:{args.seed}",
            iterations=max(args.runs, 1),
            etdump=args.etdump,
            trust_native_code=args.trust_native_code,
            trusted_blob_hashes=args.trust_hash,
        )
    except NativeRunError as exc:
        print(f"etmetal run: {exc}", file=sys.stderr)
        return 1
    if inputs is None:
        print(
            f"generated inputs (seed {args.seed}): " + ", ".join(describe(i) for i in result.inputs)
        )
    print(result.summary)
    print(f"method {args.method!r}: {len(result.outputs)} output(s)")
    for i, out in enumerate(result.outputs):
        print(f"  output {i}: {describe(out)}")
    if args.etdump:
        print(f"ETDump written to {args.etdump}")
    return 0


def run(args: argparse.Namespace) -> int:
    from etmetal.runtime import EtmetalRuntimeError, Runtime

    if args.native:
        return run_native(args)
    if args.etdump:
        print("etmetal run: --etdump needs --native", file=sys.stderr)
        return 2

    try:
        program = Runtime.get().load_program(
            args.program,
            data_files=args.data,
            trust_native_code=args.trust_native_code,
            trusted_blob_hashes=args.trust_hash,
            isolate=args.isolate,
        )
        method = program.load_method(args.method)
    except EtmetalRuntimeError as exc:
        print(f"etmetal run: {exc}", file=sys.stderr)
        return 1
    print(_where_it_runs(args.program, args.method))
    meta = method.metadata
    if args.inputs:
        inputs = [load_input(p) for p in args.inputs]
    else:
        generator = torch.Generator().manual_seed(args.seed)
        inputs = [random_input(spec, generator) for spec in meta.input_specs]
        print(f"random inputs (seed {args.seed}): " + ", ".join(describe(i) for i in inputs))
    try:
        outputs = method.execute(inputs)  # warm-up, and the outputs we print
        times = []
        for _ in range(max(args.runs, 0)):
            start = time.perf_counter()
            method.execute(inputs)
            times.append(time.perf_counter() - start)
    except EtmetalRuntimeError as exc:
        print(f"etmetal run: {exc}", file=sys.stderr)
        return 1
    print(f"method {args.method!r}: {len(outputs)} output(s)")
    for i, out in enumerate(outputs):
        print(f"  output {i}: {describe(out)}")
    if times:
        print(
            f"latency over {len(times)} runs: median {statistics.median(times) * 1e3:.3f} ms, "
            f"min {min(times) * 1e3:.3f} ms"
        )
    return 0
