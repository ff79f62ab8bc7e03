"""Fuzzing: mutated real ``.pte`` files end in a clean etmetal error or a correct run.

1,000 mutants (bit flips, byte overwrites, truncations, corrupted indices re-serialized)
of four real programs run in a worker subprocess (``fuzz_worker.py``), many cases per
process; a crash or a hang ends the worker, is recorded against the case it was in, and
the campaign restarts after that case.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig

from etmetal.testing.fuzz import run_campaign

WORKER = Path(__file__).with_name("fuzz_worker.py")
# longer campaigns: ETMETAL_FUZZ_CASES=20000 ETMETAL_FUZZ_SEED=7 pytest test/runtime/test_fuzz.py -s
CASES = int(os.environ.get("ETMETAL_FUZZ_CASES", 1000))
SEED = int(os.environ.get("ETMETAL_FUZZ_SEED", 2026))


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


def test_mutated_programs_end_in_clean_errors_or_correct_runs(seeds_dir):
    counts, bad = run_campaign(seeds_dir, CASES, seed=SEED, worker=[str(WORKER)])
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
    assert counts["error"] > CASES // 10 and counts["same"] + counts["ran"] > CASES // 50
