"""Fuzzing: mutated real ``.pte`` files end in a clean etmetal error or a correct run.

1,000 mutants (bit flips, byte overwrites, truncations, corrupted indices re-serialized)
of four real programs run in a worker subprocess (``fuzz_worker.py``), many cases per
process; a crash or a hang ends the worker, is recorded against the case it was in, and
the campaign restarts after that case.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig

WORKER = Path(__file__).with_name("fuzz_worker.py")
# longer campaigns: ETMETAL_FUZZ_CASES=20000 ETMETAL_FUZZ_SEED=7 pytest test/runtime/test_fuzz.py -s
CASES = int(os.environ.get("ETMETAL_FUZZ_CASES", 1000))
SEED = int(os.environ.get("ETMETAL_FUZZ_SEED", 2026))
CASE_TIMEOUT_S = 30.0


class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.arange(6.0))
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        self.acc.mul_(0.5).add_(x.mean(0))
        return self.lin(x).view(2, -1, 3).softmax(-1), self.acc + 1


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x).relu().flatten(1)


class Branch(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda a: a.cos() * 2, lambda a: a.sin() - 1, (x,))


class Dynamic(torch.nn.Module):
    def forward(self, x):
        return torch.cat([x, x * 2], 0).reshape(-1, 2).sum(1)


@pytest.fixture(scope="module")
def seeds_dir(tmp_path_factory, lower):
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    out = tmp_path_factory.mktemp("fuzz_seeds")
    batch = torch.export.Dim("batch", min=1, max=6)
    programs = {
        "stateful": (
            Stateful(),
            (torch.randn(4, 6),),
            dict(config=ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["acc"])])),
        ),
        "conv": (Conv(), (torch.randn(1, 3, 6, 6),), {}),
        "branch": (Branch(), (torch.randn(5),), {}),
        "dynamic": (Dynamic(), (torch.randn(3, 4),), dict(dynamic_shapes=({0: batch},))),
    }
    for name, (model, inputs, kwargs) in programs.items():
        (out / f"{name}.pte").write_bytes(lower(model, inputs, **kwargs))
        torch.save(list(inputs), out / f"{name}.inputs.pt")
    return out


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def run_campaign(seeds: Path, cases: int, seed: int) -> tuple[Counter, list[str]]:
    """Run ``cases`` mutants; returns outcome counts and the lines of every bad case."""
    counts: Counter = Counter()
    bad: list[str] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    next_case = 0
    while next_case < cases:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(seeds),
                str(next_case),
                str(cases - next_case),
                str(seed),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        current = None
        # the first case also waits for the worker's imports and seed runs
        timeout = CASE_TIMEOUT_S * 4
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                failed = current if current is not None else next_case
                counts["hang"] += 1
                bad.append(f"{failed} hang")
                next_case = failed + 1
                break
            timeout = CASE_TIMEOUT_S
            if line is None:  # worker exited
                code = proc.wait()
                if next_case >= cases:
                    break
                failed = current if current is not None else next_case
                counts["crash"] += 1
                bad.append(f"{failed} crash (exit code {code})")
                next_case = failed + 1
                break
            if line.startswith("start "):
                current = int(line.split()[1])
                continue
            case, outcome = line.split()[:2]
            counts[outcome] += 1
            if outcome == "BAD":
                bad.append(line)
            current = None
            next_case = int(case) + 1
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return counts, bad


def test_mutated_programs_end_in_clean_errors_or_correct_runs(seeds_dir):
    counts, bad = run_campaign(seeds_dir, CASES, seed=SEED)
    total = sum(counts.values())
    print(
        f"\nfuzz: {total} cases, {counts['error']} clean errors, "
        f"{counts['same'] + counts['ran']} runs ({counts['same']} unchanged programs with "
        f"identical outputs, {counts['ran']} altered programs), {counts['BAD']} bad, "
        f"{counts['crash']} crashes, {counts['hang']} hangs"
    )
    assert total == CASES
    assert not bad, "\n".join(bad[:20])
    # the mutants exercised both paths: refused programs and programs that still run
    assert counts["error"] > 100 and counts["same"] + counts["ran"] > 20
