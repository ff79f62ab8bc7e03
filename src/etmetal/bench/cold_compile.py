"""Cold compile time of one ``mps_emulated`` partition, for ``etmetal bench metal``.

A sample is a fresh interpreter that lowers a demo model for ``mps_emulated`` (Inductor's
Metal codegen, the wrapper's g++ build), loads it and runs it once (each Metal library is
compiled on first use), checked against eager. Two arms, alternated:

- ``cold``: an empty etmetal cache and an empty Inductor cache, what a fresh CI machine's
  first compile pays (the shim bridge, the MSL dispatcher, the wrapper's precompiled
  header and Inductor's CPU probes are built too);
- ``partition``: only the partition's own entries are missing (``aoti`` and ``msl``); what
  is built once per machine is warm, and Inductor's graph cache is off. This is what each
  further partition of a cold test suite costs.

Wall time and the CPU time of the sample's process and its compilers are both reported:
on a loaded machine the CPU time is the steadier of the two.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from etmetal.bench import timing as bm
from etmetal.common.targets import MPS_EMULATED

_SAMPLE = """
import sys, torch, etmetal
from etmetal.examples.demo import get_demo
from etmetal.runtime import Runtime
module, inputs = get_demo(sys.argv[1])
program, _ = etmetal.lower(module, inputs, target=sys.argv[2])
method = Runtime.get().load_program(program.buffer, trust_native_code=True).load_method("forward")
got = method.execute(list(inputs))[0]
want = module(*inputs)
err = (got - want).abs().max().item()
if not err <= 1e-4:
    raise SystemExit(f"{sys.argv[1]}: {sys.argv[2]} differs from eager by {err}")
"""

# the entries one partition adds; everything else under the cache root is per machine
PARTITION_KINDS = ("aoti", "msl")


def _run_sample(name: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one sample's interpreter and every compiler it ran."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _SAMPLE, name, MPS_EMULATED.name],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench metal cold compile of {name} failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _env(cache: Path, inductor: Path, graph_cache: bool) -> dict[str, str]:
    env = {**os.environ, "ETMETAL_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    if not graph_cache:
        env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
        env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
    return env


def bench_cold_compile(name: str, repeat: int) -> bm.Comparison:
    """``cold`` and ``partition`` samples of demo model ``name``, alternated ``repeat``
    times (a sample takes seconds to tens of seconds)."""
    walls: dict[str, list[float]] = {"cold": [], "partition": []}
    cpus: dict[str, list[float]] = {"cold": [], "partition": []}
    with tempfile.TemporaryDirectory(prefix="etmetal-bench-cold-") as tmp:
        warm, warm_inductor = Path(tmp) / "warm", Path(tmp) / "warm-inductor"
        warm.mkdir(mode=0o700)
        warm_inductor.mkdir()
        _run_sample(name, _env(warm, warm_inductor, graph_cache=False))  # the per-machine builds
        for i in range(repeat):
            cache, inductor = Path(tmp) / f"cold-{i}", Path(tmp) / f"cold-inductor-{i}"
            cache.mkdir(mode=0o700)
            inductor.mkdir()
            wall, cpu = _run_sample(name, _env(cache, inductor, graph_cache=True))
            walls["cold"].append(wall)
            cpus["cold"].append(cpu)
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(inductor, ignore_errors=True)
            for kind in PARTITION_KINDS:
                shutil.rmtree(warm / kind, ignore_errors=True)
            wall, cpu = _run_sample(name, _env(warm, warm_inductor, graph_cache=False))
            walls["partition"].append(wall)
            cpus["partition"].append(cpu)
    timings = {k: bm.Timing(k, statistics.median(v), min(v), len(v), v) for k, v in walls.items()}
    row = bm.Comparison("metal", f"cold_compile_{name}", timings)
    row.add_ratio("partition", "cold")
    row.extra.update(
        description=(
            f"lower {name} for mps_emulated, load and run it once, in a fresh interpreter: "
            "cold = empty caches; partition = only the partition's aoti/msl entries missing"
        ),
        cpu_s={k: statistics.median(v) for k, v in cpus.items()},
        wall_s={k: statistics.median(v) for k, v in walls.items()},
    )
    return row
