"""``etmetal bench isolation``: the cost of running delegates in a worker process.

For one demo model lowered to the Metal delegate: the median execute latency in
process and with ``isolate=True`` (interleaved runs), and the time to start a worker
(spawn + delegate init).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from etmetal.common.targets import HOST


@dataclass(frozen=True)
class IsolationCost:
    model: str
    in_process_us: float
    isolated_us: float
    spawn_s: float

    @property
    def ratio(self) -> float:
        return self.isolated_us / self.in_process_us


def _median_us(method, inputs, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        method.execute(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(name: str, runs: int) -> IsolationCost:
    """Lower the demo model ``name`` for the host target and time both ways of running it.

    Raises ``SystemExit`` when the isolated and in-process outputs differ."""
    from etmetal.backend.lowering import lower
    from etmetal.examples.demo import get_demo
    from etmetal.runtime import Runtime

    module, inputs = get_demo(name)
    program, _ = lower(module, inputs, target=HOST)
    inputs = list(inputs)
    runtime = Runtime.get()
    local_method = runtime.load_program(program.buffer, trust_native_code=True).load_method(
        "forward"
    )
    start = time.perf_counter()
    isolated = runtime.load_program(program.buffer, trust_native_code=True, isolate=True)
    iso_method = isolated.load_method("forward")
    spawn = time.perf_counter() - start
    try:
        for m in (local_method, iso_method):  # warm-up, and both agree
            out = m.execute(inputs)
        if not torch.equal(out[0], local_method.execute(inputs)[0]):
            raise SystemExit(f"bench isolation: {name}: isolated and in-process outputs differ")
        local_us, iso_us = [], []
        for _ in range(5):  # interleave to share machine noise
            local_us.append(_median_us(local_method, inputs, max(runs // 5, 1)))
            iso_us.append(_median_us(iso_method, inputs, max(runs // 5, 1)))
    finally:
        iso_method.destroy()
        local_method.destroy()
    return IsolationCost(name, statistics.median(local_us), statistics.median(iso_us), spawn)
