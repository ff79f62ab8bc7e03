"""A seeded fuzz campaign over Metal-delegated programs (``etmetal bench fuzz``, the tests).

Mutants of real delegated ``.pte`` files (whole-file, weights-blob and processed-bytes
mutations) and random shim call sequences (family ``delegate``), or programs whose
operator tables name random operators (family ``operators``), run in worker subprocesses
(``etmetal.testing.fuzz_worker``), many cases per process; a crash or hang ends the
worker, is recorded against its case, and the campaign restarts after it. Prints
cases, clean errors, correct runs, altered-but-valid runs, bad outcomes, crashes, hangs.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

from etmetal.common.targets import HOST

CASE_TIMEOUT_S = 30.0
STARTUP_TIMEOUT_S = 180.0


class Tiny(torch.nn.Module):
    """Linear + chunk + cat: views with holes the ``.so`` writes through."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 12)

    def forward(self, x):
        a, b, c = self.lin(x).chunk(3, dim=-1)
        return torch.cat([c.relu(), a * b], dim=-1)


def build_seeds(out_dir: Path) -> Path:
    """Write the seed programs (with inputs and eager outputs) into ``out_dir``."""
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from etmetal.backend.lowering import lower
    from etmetal.examples.demo import get_demo

    with torch.random.fork_rng():
        torch.manual_seed(0)
        models = {"tiny": (Tiny().eval(), (torch.randn(3, 8),))}
    models["patch_embedding"] = get_demo("patch_embedding")
    # host programs store their constants one by one (shared layout); fuzz upstream's
    # one-blob layout too, with the same compiled .so (the opt-out compile spec)
    models["tiny_one_blob"] = models["tiny"]
    for name, (module, inputs) in models.items():
        specs = [CompileSpec("share_weights", b"0")] if name.endswith("one_blob") else None
        program, _ = lower(module, inputs, target=HOST, compile_specs=specs)
        (out_dir / f"{name}.pte").write_bytes(program.buffer)
        torch.save(list(inputs), out_dir / f"{name}.inputs.pt")
        with torch.no_grad():
            expected = module(*inputs)
        torch.save([expected], out_dir / f"{name}.expected.pt")
    return out_dir


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def run_campaign(
    seeds: Path,
    cases: int,
    seed: int,
    worker: Sequence[str] = ("-m", "etmetal.testing.fuzz_worker"),
    kinds: Sequence[str] | None = None,
    by_kind: Counter | None = None,
    family: str = "delegate",
) -> tuple[Counter, list[str]]:
    """Run ``cases`` cases; returns outcome counts and the lines of every bad case.

    ``worker`` is the Python command line (after the interpreter) of a worker that takes
    ``SEEDS FIRST COUNT SEED [FAMILY]`` (``family``: ``delegate`` mutates the seed
    programs, ``operators`` needs no seeds; see the worker), prints ``start N`` before case N and ``N OUTCOME ...``
    after it. A worker that dies or stalls is charged to the case it was in, and the
    campaign resumes after that case in a new worker. ``kinds`` restricts the delegate
    family's case kinds (``fuzz_worker.ALL_KINDS``); ``by_kind`` (if given) counts
    ``(kind, outcome)`` pairs.
    """
    counts: Counter = Counter()
    bad: list[str] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if kinds is not None:
        env["ETMETAL_FUZZ_KINDS"] = ",".join(kinds)
    next_case = 0
    while next_case < cases:
        cmd = [sys.executable, *worker, str(seeds)]
        cmd += [str(next_case), str(cases - next_case), str(seed)]
        if family != "delegate":
            cmd.append(family)
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        current = None
        timeout = STARTUP_TIMEOUT_S  # imports and seed checks
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
            if line is None:
                code = proc.wait()
                if next_case >= cases and code == 0:
                    break
                failed = current if current is not None else next_case
                counts["crash"] += 1
                bad.append(f"{failed} crash (exit code {code})")
                next_case = failed + 1
                break
            if line.startswith("start "):
                current = int(line.split()[1])
                continue
            case, outcome, *rest = line.split()
            counts[outcome] += 1
            if by_kind is not None and rest:
                by_kind[(rest[0], outcome)] += 1
            if outcome == "BAD":
                bad.append(line)
            current = None
            next_case = int(case) + 1
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return counts, bad


def summary(counts: Counter) -> str:
    total = sum(counts.values())
    return (
        f"fuzz: {total} cases, {counts['error']} clean errors, {counts['correct']} correct runs, "
        f"{counts['ran']} altered-program runs, {counts['BAD']} bad, {counts['crash']} crashes, "
        f"{counts['hang']} hangs"
    )
