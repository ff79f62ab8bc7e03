"""Fuzz worker: mutate real ``.pte`` files and run each mutant in etmetal's runtime.

Run as a script: ``python fuzz_worker.py SEEDS_DIR FIRST COUNT SEED``. For each case id
it writes ``start <id>`` before and ``<id> <outcome> <detail>`` after, flushed, so the
parent can tell which case a crash or hang happened in and restart after it. Outcomes:

- ``error``: a clean ``etmetal.runtime`` error;
- ``same``: the mutant parses to the same program and produced the original outputs;
- ``ran``: the mutant is a different (valid) program and ran to completion;
- ``BAD``: any other exception, or ``same`` with different outputs.
"""

from __future__ import annotations

import copy
import os
import random
import sys
import traceback
from pathlib import Path

os.environ.setdefault("ETMETAL_MAX_MEMORY", str(256 << 20))
os.environ.setdefault("ETMETAL_MAX_STEPS", "100000")

import torch  # noqa: E402
from executorch.exir._serialize._program import (  # noqa: E402
    deserialize_pte_binary,
    serialize_pte_binary,
)

from etmetal.runtime import EtmetalRuntimeError, Runtime  # noqa: E402

torch.set_num_threads(1)
STRATEGIES = ("bitflip", "bytes", "truncate", "index", "index", "index")


class Seed:
    def __init__(self, path: Path):
        self.data = path.read_bytes()
        self.pte = deserialize_pte_binary(self.data)
        inputs = torch.load(path.with_suffix(".inputs.pt"), weights_only=True)
        self.inputs = inputs
        self.outputs = Runtime.get().load_program(self.data).load_method("forward").execute(inputs)


def _ints(obj, path=()):
    """Every (parent, field, index-or-None) holding an int inside a schema object."""
    found = []
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            if isinstance(item, int) and not isinstance(item, bool):
                found.append((obj, i))
            else:
                found.extend(_ints(item))
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            value = getattr(obj, name)
            if isinstance(value, int) and not isinstance(value, bool):
                found.append((obj, name))
            elif isinstance(value, (list,)) or hasattr(value, "__dataclass_fields__"):
                found.extend(_ints(value))
    return found


def _corrupt_index(seed: Seed, rng: random.Random) -> bytes | None:
    pte = copy.deepcopy(seed.pte)
    program = pte.program
    targets = _ints(program.execution_plan)
    if not targets:
        return None
    for _ in range(rng.randint(1, 3)):
        parent, key = rng.choice(targets)
        old = parent[key] if isinstance(parent, list) else getattr(parent, key)
        new = rng.choice(
            [old + 1, old - 1, old * 2 + 1, -1, 0, rng.randint(0, 64), 2**31 - 1, 2**20, old + 4096]
        )
        if isinstance(parent, list):
            parent[key] = new
        else:
            setattr(parent, key, new)
    try:
        return bytes(serialize_pte_binary(pte))
    except Exception:
        return None  # a value the serializer cannot encode: not a file anyone can write


def mutate(seed: Seed, rng: random.Random) -> tuple[str, bytes]:
    data = bytearray(seed.data)
    while True:
        strategy = rng.choice(STRATEGIES)
        if strategy == "bitflip":
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(data))
                data[pos] ^= 1 << rng.randrange(8)
            return strategy, bytes(data)
        if strategy == "bytes":
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.choice(
                    [0, 0xFF, 0x7F, 0x80, rng.randrange(256)]
                )
            return strategy, bytes(data)
        if strategy == "truncate":
            return strategy, bytes(data[: rng.randrange(len(data))])
        mutated = _corrupt_index(seed, rng)
        if mutated is not None:
            return strategy, mutated


def _same_program(seed: Seed, data: bytes) -> bool:
    try:
        pte = deserialize_pte_binary(data)
    except Exception:
        return False
    return pte.program == seed.pte.program and pte.mutable_data == seed.pte.mutable_data


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


def run_case(seed: Seed, data: bytes) -> tuple[str, str]:
    try:
        method = Runtime.get().load_program(data).load_method("forward")
        outputs = method.execute(seed.inputs)
    except EtmetalRuntimeError as exc:
        return "error", f"{type(exc).__name__}: {exc}"[:300]
    except BaseException as exc:  # noqa: BLE001 - the point is to report anything else
        tb = traceback.format_exception(exc)[-3:]
        return "BAD", f"{type(exc).__name__}: {exc} | {' '.join(t.strip() for t in tb)}"[:500]
    if _same_program(seed, data):
        ok = len(outputs) == len(seed.outputs) and all(map(_equal, outputs, seed.outputs))
        return ("same", "") if ok else ("BAD", "unchanged program, different outputs")
    return "ran", ""


def main() -> None:
    seeds_dir, first, count, base_seed = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    seeds = [Seed(p) for p in sorted(Path(seeds_dir).glob("*.pte"))]
    out = sys.stdout
    for case in range(first, first + count):
        rng = random.Random(base_seed * 1_000_003 + case)
        seed = seeds[case % len(seeds)]
        strategy, data = mutate(seed, rng)
        out.write(f"start {case}\n")
        out.flush()
        outcome, detail = run_case(seed, data)
        out.write(f"{case} {outcome} {strategy} {detail}\n".replace("\n", " ").rstrip() + "\n")
        out.flush()


if __name__ == "__main__":
    main()
