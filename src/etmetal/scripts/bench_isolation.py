"""``etmetal bench isolation``: the cost of running delegates in a worker process.

For each demo model lowered to the Metal delegate, the median execute latency in
process and with ``isolate=True`` (interleaved runs), their ratio, and the time to
start a worker (spawn + delegate init).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from etmetal.common.targets import HOST


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=300, help="timed executes per mode")
    parser.add_argument("--models", nargs="*", default=None, help="demo models (default all)")
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads (default 1)")


def _median_us(method, inputs, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        method.execute(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def run(args: argparse.Namespace) -> int:
    from etmetal.runtime import Runtime  # noqa: I001 - models.demo arrives with the delegate branch
    from etmetal.backend.lowering import lower
    from etmetal.examples.demo import DEMO_MODELS, get_demo

    torch.set_num_threads(args.threads)  # the worker takes the host's thread count
    names = args.models or [m.name for m in DEMO_MODELS]
    print(f"{'model':<20} {'in-process us':>14} {'isolated us':>12} {'ratio':>6} {'spawn s':>8}")
    for name in names:
        module, inputs = get_demo(name)
        program, _ = lower(module, inputs, target=HOST)
        inputs = list(inputs)
        runtime = Runtime.get()
        local = runtime.load_program(program.buffer, trust_native_code=True)
        local_method = local.load_method("forward")
        start = time.perf_counter()
        isolated = runtime.load_program(program.buffer, trust_native_code=True, isolate=True)
        iso_method = isolated.load_method("forward")
        spawn = time.perf_counter() - start
        for m in (local_method, iso_method):  # warm-up, and both agree
            out = m.execute(inputs)
        if not torch.equal(out[0], local_method.execute(inputs)[0]):
            print(f"{name}: isolated and in-process outputs differ")
            return 1
        local_us, iso_us = [], []
        for _ in range(5):  # interleave to share machine noise
            local_us.append(_median_us(local_method, inputs, max(args.runs // 5, 1)))
            iso_us.append(_median_us(iso_method, inputs, max(args.runs // 5, 1)))
        a, b = statistics.median(local_us), statistics.median(iso_us)
        print(f"{name:<20} {a:>14.1f} {b:>12.1f} {b / a:>6.2f} {spawn:>8.2f}")
        iso_method.destroy()
        local_method.destroy()
    return 0
