"""Stock-runtime fuzz worker (``python -m etmetal.testing.fuzz_stock_worker SEEDS FIRST COUNT
SEED``): the program mutations of :mod:`etmetal.testing.fuzz_worker` loaded and run by the
stock ExecuTorch runtime (``executorch.runtime``, its default verification) with etmetal's
native MetalBackend registered.

Case kinds (``id % 3``, or the ``ETMETAL_FUZZ_KINDS`` subset): ``pte`` (the whole file),
``weights`` (a constants entry, re-keyed so it reaches the ``.so``) and ``processed`` (the
delegate's key lines), from the same seeded mutators, so a case id names the same mutant
in both campaigns. The shim-call kinds exercise etmetal's Python shim layer, which this
runtime does not use.

Trust: the backend trusts exactly the seeds' ``.so`` files, by sha256
(``register(trusted_blob_hashes=...)``, the policy for a host delegate without an
extern-node table), not all native code. A mutant whose ``.so`` bytes changed either fails
its key's digest or, re-keyed, is untrusted: no mutated machine code is ever loaded, which
would test the mutation, not the runtime (and run arbitrary code). Everything else a mutant
alters (the flatbuffer, the processed bytes, the compile specs, the weights and the index)
reaches the native code paths as a trusted program's would.

Outcomes as in the Python campaign: ``error`` (the runtime refused with its error),
``correct`` (ran and matches eager), ``ran`` (an altered but valid program ran and gave,
bit for bit, what etmetal's Python runtime gives for the same bytes), ``BAD`` (any other
exception, or a disagreement with that reference); a crash or hang is charged by the parent
(:func:`etmetal.testing.fuzz.run_campaign`).
"""

from __future__ import annotations

import gc
import os
import random
import sys
from pathlib import Path

PROGRAM_KINDS = ("pte", "weights", "processed")
_env_kinds = os.environ.get("ETMETAL_FUZZ_KINDS", ",".join(PROGRAM_KINDS))
KINDS = tuple(k for k in _env_kinds.split(",") if k)
if not KINDS or set(KINDS) - set(PROGRAM_KINDS):
    raise SystemExit(f"ETMETAL_FUZZ_KINDS={_env_kinds!r}: the stock arm runs {PROGRAM_KINDS}")

import torch  # noqa: E402

from etmetal.testing import fuzz_worker  # noqa: E402  (the mutators and the comparison)


class StockSeed:
    """A seed program with its inputs and eager outputs; the unmutated program must run in
    the stock runtime and match eager, or no case of the campaign means anything."""

    def __init__(self, path: Path) -> None:
        from etmetal.testing.pte_blobs import metal_delegates

        self.data = path.read_bytes()
        self.inputs = torch.load(path.with_suffix(".inputs.pt"), weights_only=True)
        self.expected = torch.load(path.with_suffix(".expected.pt"), weights_only=True)
        self.so_digests = [d.keys[0][:64] for d in metal_delegates(self.data)]
        self.path = path

    def check(self) -> None:
        outcome, detail = run_program(self, self.data)
        if outcome != "correct":
            raise SystemExit(f"{self.path}: the unmutated seed gives {outcome} {detail}")


def run_program(seed: StockSeed, data: bytes) -> tuple[str, str]:
    from executorch.runtime import Runtime

    try:
        program = Runtime.get().load_program(data)
        method = program.load_method("forward")
        outputs = [
            t.clone() if isinstance(t, torch.Tensor) else t
            for t in method.execute(list(seed.inputs))
        ]
    except RuntimeError as exc:  # how the pybind module reports an ExecuTorch Error
        return "error", f"{exc}"[:200]
    except BaseException as exc:  # noqa: BLE001 - anything else is a finding
        return "BAD", f"{type(exc).__name__}: {exc}"[:500]
    finally:
        method = program = None  # destroy the delegate before the next case
        gc.collect()
    if fuzz_worker._close(outputs, seed.expected):
        return "correct", ""
    return _same_as_reference(data, seed, outputs)


def _same_as_reference(data: bytes, seed: StockSeed, outputs: list) -> tuple[str, str]:
    """An altered program that ran (other weights, say) must give what etmetal's Python
    runtime, the reference implementation, gives for the same bytes, bit for bit: reading
    the same constants through the same ``.so`` (one of the seeds', trusted by digest, so
    loading it here is as safe as in the stock runtime) leaves no room for a difference."""
    from etmetal.runtime import EtmetalRuntimeError, Runtime

    try:
        method = Runtime.get().load_program(data, trust_native_code=True).load_method("forward")
        try:
            want = method.execute(list(seed.inputs))
        finally:
            method.destroy()
    except EtmetalRuntimeError as exc:
        return "BAD", f"the stock runtime ran what etmetal's runtime refuses: {exc}"[:500]
    same = len(want) == len(outputs) and all(map(_identical, outputs, want))
    return ("ran", "") if same else ("BAD", "the stock runtime's outputs differ from etmetal's")


def _identical(a, b) -> bool:
    """Equal bit for bit, a NaN where the other has a NaN (altered weights can make them)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def mutant(seed: StockSeed, kind: str, rng: random.Random) -> bytes:
    if kind == "pte":
        return fuzz_worker.mutate_bytes(seed.data, rng)
    if kind == "weights":
        return fuzz_worker.mutate_weights(seed, rng)
    return fuzz_worker.mutate_processed(seed, rng)


def run_case(seeds: list[StockSeed], case: int, base_seed: int) -> tuple[str, str, str]:
    rng = random.Random(base_seed * 1_000_003 + case)
    kind = KINDS[case % len(KINDS)]
    seed = seeds[(case // len(KINDS)) % len(seeds)]
    return (kind, *run_program(seed, mutant(seed, kind, rng)))


def trust_seeds(seeds: list[StockSeed]) -> None:
    """Register etmetal's backend trusting the seeds' ``.so`` files alone (by sha256),
    whatever this process's environment says."""
    import etmetal.stock_runtime as stock

    os.environ.pop("ETMETAL_TRUST_NATIVE_CODE", None)
    os.environ.pop("ETMETAL_TRUSTED_BLOBS", None)
    stock.register(trusted_blob_hashes=[h for s in seeds for h in s.so_digests])


def main(argv: list[str]) -> int:

    seeds_dir, first, count, base_seed = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    if len(argv) > 4 and argv[4] != "delegate":
        raise SystemExit(f"the stock arm runs the delegate family only, not {argv[4]!r}")
    torch.set_num_threads(1)
    seeds = [StockSeed(p) for p in sorted(Path(seeds_dir).glob("*.pte"))]
    if not seeds:
        raise SystemExit(f"no seed programs (*.pte) in {seeds_dir}")
    trust_seeds(seeds)
    for s in seeds:
        s.check()
    out = sys.stdout
    for case in range(first, first + count):
        out.write(f"start {case}\n")
        out.flush()
        kind, outcome, detail = run_case(seeds, case, base_seed)
        out.write(f"{case} {outcome} {kind} {detail}".replace("\n", " ") + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
