"""Fuzz worker (``python -m etmetal.testing.fuzz_worker SEEDS FIRST COUNT SEED [FAMILY]``).

``FAMILY`` is ``delegate`` (default, the kinds below) or ``operators``
(:mod:`etmetal.testing.fuzz_operators`: operator tables naming random operators).

Runs cases ``FIRST .. FIRST+COUNT-1`` of a seeded campaign over Metal-delegated programs
and prints ``start <id>`` before and ``<id> <outcome> <kind> <detail>`` after each case,
flushed, so the parent can attribute a crash or hang. Case kinds (``id % 4``):

- ``pte``: bit flips, byte overwrites, truncation of the whole ``.pte``;
- ``weights``: the weights blob mutated (flips, truncation, extension) and re-keyed
  with its new sha256, so the mutant passes the integrity check and reaches the ``.so``;
- ``processed``: the delegate's processed bytes mutated;
- ``shim``: a random sequence of C shim calls with hostile arguments, proxy executor
  calls among them (unknown node indices, argument counts that disagree with the node's
  schema, tensors of the wrong dtype, bogus handles, a NULL or unknown executor);
- ``mps``: hostile call sequences on the emulated Metal device
  (``etmetal.testing.mps_hostile``): its named cases (use after free, an int into a
  pointer slot, copies past their source, wrapping or oversized grids, foreign includes)
  mixed with valid and random encodings, dispatches and copies; every call must return a
  code, every named case must be refused.

The two shim kinds run each sequence on both shim implementations, the native one and the
Python reference (``ETMETAL_FUZZ_SHIMS``), from the same seed: every call must return the
same code on both.

Outcomes: ``error`` (a clean etmetal error), ``correct`` (ran, outputs match eager),
``ran`` (a valid altered program ran, e.g. other weights), ``BAD`` (anything else).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import sys
import traceback
from pathlib import Path

os.environ.setdefault("ETMETAL_MAX_MEMORY", str(256 << 20))
os.environ.setdefault("ETMETAL_MAX_STEPS", "100000")
# the mps family's valid grids stay small; larger ones must be refused, not run for seconds
os.environ.setdefault("ETMETAL_MPS_MAX_THREADS", str(1 << 20))

import torch  # noqa: E402
from executorch.exir._serialize._program import (  # noqa: E402
    deserialize_pte_binary,
    serialize_pte_binary,
)

from etmetal.testing.fuzz_both import on_both_implementations  # noqa: E402
from etmetal.testing.pte_blobs import named_bytes, replace_named  # noqa: E402

ALL_KINDS = ("pte", "weights", "processed", "shim", "metal_shims")
# ETMETAL_FUZZ_KINDS (comma-separated) restricts a campaign to some families
KINDS = tuple(k for k in os.environ.get("ETMETAL_FUZZ_KINDS", ",".join(ALL_KINDS)).split(",") if k)
_unknown = sorted(set(KINDS) - set(ALL_KINDS))
if _unknown or not KINDS:
    raise SystemExit(f"ETMETAL_FUZZ_KINDS: unknown families {_unknown}; known: {ALL_KINDS}")
# the shim implementations each shim sequence runs on, in order (ETMETAL_FUZZ_SHIMS,
# comma-separated; default both: the native one, then the Python reference)
IMPLEMENTATIONS = tuple(
    i for i in os.environ.get("ETMETAL_FUZZ_SHIMS", "native,python").split(",") if i
)
if not IMPLEMENTATIONS or set(IMPLEMENTATIONS) - {"native", "python"}:
    raise SystemExit(f"ETMETAL_FUZZ_SHIMS: {IMPLEMENTATIONS}; known: native, python")


class Seed:
    def __init__(self, path: Path):
        from etmetal.runtime import Runtime

        self.data = path.read_bytes()
        self.inputs = torch.load(path.with_suffix(".inputs.pt"), weights_only=True)
        self.expected = torch.load(path.with_suffix(".expected.pt"), weights_only=True)
        program = Runtime.get().load_program(self.data, trust_native_code=True)
        outputs = program.load_method("forward").execute(self.inputs)
        if not _close(outputs, self.expected):
            raise RuntimeError(f"{path}: the unmutated seed does not match eager")


def _close(outputs, expected) -> bool:
    return len(outputs) == len(expected) and all(
        isinstance(o, torch.Tensor) and o.shape == e.shape and torch.allclose(o, e, 1e-4, 1e-4)
        for o, e in zip(outputs, expected)
    )


def _flip(data: bytearray, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data[rng.randrange(len(data))] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])


def mutate_bytes(blob: bytes, rng: random.Random) -> bytes:
    data = bytearray(blob)
    if not data:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    r = rng.random()
    if r < 0.6:
        _flip(data, rng)
    elif r < 0.8:
        del data[rng.randrange(len(data)) :]
    else:
        data += bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 64, 4096])))
    return bytes(data)


# the named data a delegate's constants live in: upstream's one blob, or the shared
# layout's index and per-constant entries
_WEIGHT_SUFFIXES = ("_weights_blob", "_weights_index", "_weight")


def mutate_weights(seed: Seed, rng: random.Random) -> bytes:
    """The seed with one constants entry mutated and every key naming it rehashed, so
    the load gets past the integrity checks to what reads the bytes."""
    named = named_bytes(seed.data)
    key = rng.choice(sorted(k for k in named if k.endswith(_WEIGHT_SUFFIXES)))
    return replace_named(seed.data, {key: mutate_bytes(named[key], rng)})


def mutate_processed(seed: Seed, rng: random.Random) -> bytes:
    pte = deserialize_pte_binary(seed.data)
    inline = rng.choice(pte.program.backend_delegate_data)
    data = bytes(inline.data)
    if rng.random() < 0.3:  # structural: swap, drop or duplicate the two key lines
        lines = data.split(b"\n")
        data = b"\n".join(rng.choice([lines[::-1], lines[:1], lines + lines[-1:], [b""]]))
    else:
        data = mutate_bytes(data, rng)
    inline.data = data
    return bytes(serialize_pte_binary(pte))


def run_program(seed: Seed, data: bytes) -> tuple[str, str]:
    from etmetal.runtime import EtmetalRuntimeError, Runtime

    try:
        program = Runtime.get().load_program(data, trust_native_code=True)
        outputs = program.load_method("forward").execute(seed.inputs)
    except EtmetalRuntimeError as exc:
        return "error", f"{type(exc).__name__}: {exc}"[:200]
    except BaseException as exc:  # noqa: BLE001 - anything else is a finding
        tb = " ".join(t.strip() for t in traceback.format_exception(exc)[-3:])
        return "BAD", f"{type(exc).__name__}: {exc} | {tb}"[:500]
    return ("correct", "") if _close(outputs, seed.expected) else ("ran", "")


class _Recording:
    """The C API, noting each call's name and returned code in ``codes`` (when a list)."""

    def __init__(self, lib, codes: list | None) -> None:
        self._lib, self._codes = lib, codes

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)
        if self._codes is None:
            return fn

        def call(*args):
            rc = fn(*args)
            self._codes.append((name, rc))
            return rc

        return call


# the proxy executor the shim sequences call: an add (alpha is a dynamic int) and an
# antialiased upsample (output size dynamic), both on float32 tensors
def _arg(name: str, arg: dict) -> dict:
    return {"name": name, "arg": arg}


_PROXY_TABLE = json.dumps(
    {
        "nodes": [
            {"name": "buf0", "node": {
                "target": "aten::add.Tensor",
                "inputs": [_arg("self", {"as_tensor": {"name": "a"}}),
                           _arg("other", {"as_tensor": {"name": "b"}}),
                           _arg("alpha", {"as_int": 1})],
                "outputs": [{"as_tensor": {"name": "c"}}],
                "metadata": {"etmetal_tensor_dtypes": json.dumps(dict.fromkeys("abc", "float32"))},
            }},
            {"name": "buf1", "node": {
                "target": "aten::_upsample_bilinear2d_aa",
                "inputs": [_arg("self", {"as_tensor": {"name": "x"}}),
                           _arg("output_size", {"as_ints": [2, 2]}),
                           _arg("align_corners", {"as_bool": False})],
                "outputs": [{"as_tensor": {"name": "y"}}],
            }},
        ]
    }
)  # fmt: skip
_proxy_handle: int | None = None


def _proxy_call(lib, rng: random.Random, live: list[int]) -> int:
    """One hostile ``aoti_torch_proxy_executor_call_function``; its output placeholder (made
    first, filled on success) joins ``live``."""
    global _proxy_handle
    from etmetal.shims import default_context
    from etmetal.shims.abi_codes import DEVICE_CPU
    from etmetal.shims.proxy_executor import ProxyExecutor

    ctx = default_context()
    if _proxy_handle is None:
        _proxy_handle = ctx.register_proxy_executor(
            ProxyExecutor.from_json(_PROXY_TABLE, DEVICE_CPU)
        )
    out = ctypes.c_void_p()
    if lib.aoti_torch_new_uninitialized_tensor(ctypes.byref(out)) != 0:
        return 2  # reported as a bad return code
    live.append(out.value)
    n_tensors = rng.choice([0, 1, 2, 3, 3, 4, -1])
    pool = [*live, 0xBAD0, 0] if rng.random() < 0.2 else list(live)
    handles = [rng.choice(pool) for _ in range(4)]
    if 0 < n_tensors <= 4:
        handles[n_tensors - 1] = out.value
    ints = (ctypes.c_int64 * 4)(*[rng.choice([1, 2, 3, 0, -1]) for _ in range(4)])
    return lib.aoti_torch_proxy_executor_call_function(
        rng.choice([_proxy_handle] * 4 + [0, 0xBAD0]),
        rng.choice([0, 0, 1, 1, 2, -1, 1 << 20]),
        rng.choice([0, 1, 1, 2, 2, 3, -1]),
        ints,
        n_tensors,
        (ctypes.c_void_p * 4)(*handles),
    )


def shim_sequence(rng: random.Random, codes: list | None = None) -> tuple[str, str]:
    """Random hostile C shim calls; every call must return 0/1 and all memory come back.
    ``codes`` (if given) collects (call, returned code) in order."""
    from etmetal.shims import c_api, clear_last_error, memory_stats

    lib = _Recording(c_api(), codes)
    before = memory_stats()
    live: list[int] = []
    i64 = ctypes.c_int64
    failures = 0
    for _ in range(rng.randint(5, 40)):
        op = rng.choice(
            ["empty", "empty", "view", "delete", "bogus", "null", "numel", "copy", "proxy"]
        )
        out = ctypes.c_void_p()
        ndim = rng.randint(0, 3)
        sizes = (i64 * max(ndim, 1))(
            *[rng.choice([0, 1, 2, 3, 7, -1, 1 << 40]) for _ in range(ndim)]
        )
        strides = (i64 * max(ndim, 1))(*[rng.choice([1, 2, 0, -1, 3]) for _ in range(ndim)])
        dtype = rng.choice([6, 6, 7, 3, 77, -1])
        if op == "empty":
            rc = lib.aoti_torch_empty_strided(ndim, sizes, strides, dtype, 0, 0, ctypes.byref(out))
        elif op == "view" and live:
            rc = lib.aoti_torch__reinterpret_tensor(
                rng.choice(live), ndim, sizes, strides, rng.choice([0, 1, 5, -3, 1 << 33]),
                ctypes.byref(out),
            )  # fmt: skip
        elif op == "delete" and live:
            h = live.pop(rng.randrange(len(live)))
            rc = lib.aoti_torch_delete_tensor_object(h)
            if rc != 0:
                return "BAD", "deleting a live handle failed"
            if rng.random() < 0.3:  # double delete must be refused
                if lib.aoti_torch_delete_tensor_object(h) == 0:
                    return "BAD", "double delete accepted"
                failures += 1
            continue
        elif op == "bogus":
            rc = lib.aoti_torch_delete_tensor_object(rng.choice([0, 1, 0xBAD0, 0x7E70_0000_0010]))
            if rc == 0:
                return "BAD", "deleting a bogus handle succeeded"
            failures += 1
            continue
        elif op == "null":
            rc = lib.aoti_torch_empty_strided(ndim, sizes, strides, 6, 0, 0, None)
            if rc == 0:
                return "BAD", "NULL out-pointer accepted"
            failures += 1
            continue
        elif op == "numel" and live:
            n = i64()
            rc = lib.aoti_torch_get_numel(rng.choice(live), ctypes.byref(n))
        elif op == "copy" and len(live) > 1:
            rc = lib.aoti_torch_copy_(rng.choice(live), rng.choice(live), 0)
        elif op == "proxy":
            rc = _proxy_call(lib, rng, live)
        else:
            continue
        if rc not in (0, 1):
            return "BAD", f"{op} returned {rc}"
        if rc == 1:
            failures += 1
        elif out.value:
            live.append(out.value)
    clear_last_error()
    for h in live:
        if lib.aoti_torch_delete_tensor_object(h) != 0:
            return "BAD", "deleting a live handle failed"
    after = memory_stats()
    if (after.tensors, after.storages, after.bytes) != (
        before.tensors,
        before.storages,
        before.bytes,
    ):
        return "BAD", f"leak: {before} -> {after}"
    return ("error" if failures else "correct"), f"{failures} refused calls"


def mps_sequence(rng: random.Random, codes: list | None = None) -> tuple[str, str]:
    """A hostile emulated-device sequence: codes only, named hostile cases refused.
    ``codes`` (if given) collects its (call, returned code) pairs."""
    from etmetal.shims import clear_last_error, default_context
    from etmetal.shims.emulated_mps.mps_device import take_unchecked_error
    from etmetal.testing.mps_hostile import CASES, random_sequence

    try:
        calls = random_sequence(rng)
    except BaseException as exc:  # noqa: BLE001 - a foreign exception is a finding
        return "BAD", f"{type(exc).__name__}: {exc}"[:300]
    finally:
        take_unchecked_error(default_context())
        clear_last_error()
    if codes is not None:
        codes.extend(calls)
    for call, rc in calls:
        if rc not in (0, 1):
            return "BAD", f"{call} returned {rc}"
        if call in CASES and rc != 1:
            return "BAD", f"the hostile case {call} was accepted"
    refused = sum(rc for _, rc in calls)
    return ("error" if refused else "correct"), f"{len(calls)} calls, {refused} refused"


def run_case(seeds: list[Seed], case: int, base_seed: int) -> tuple[str, str, str]:
    case_seed = base_seed * 1_000_003 + case
    rng = random.Random(case_seed)
    kind = KINDS[case % len(KINDS)]
    if kind == "shim":
        return (kind, *on_both_implementations(shim_sequence, case_seed, IMPLEMENTATIONS))
    if kind == "metal_shims":
        return (kind, *on_both_implementations(mps_sequence, case_seed, IMPLEMENTATIONS))
    seed = seeds[(case // len(KINDS)) % len(seeds)]
    if kind == "pte":
        data = mutate_bytes(seed.data, rng)
    elif kind == "weights":
        data = mutate_weights(seed, rng)
    else:
        data = mutate_processed(seed, rng)
    return (kind, *run_program(seed, data))


def main(argv: list[str]) -> int:
    seeds_dir, first, count, base_seed = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    family = argv[4] if len(argv) > 4 else "delegate"
    torch.set_num_threads(1)
    if family == "operators":  # the x + 1 program of etmetal.testing.hostile_programs
        from etmetal.testing import fuzz_operators

        pools = fuzz_operators.Pools()

        def case_of(case: int) -> tuple[str, str, str]:
            rng = random.Random(base_seed * 1_000_003 + case)
            return fuzz_operators.run_case(pools, rng, case)
    elif family == "delegate":
        seeds = [Seed(p) for p in sorted(Path(seeds_dir).glob("*.pte"))]

        def case_of(case: int) -> tuple[str, str, str]:
            return run_case(seeds, case, base_seed)
    else:
        raise SystemExit(f"unknown fuzz family {family!r} (delegate, operators)")
    out = sys.stdout
    for case in range(first, first + count):
        out.write(f"start {case}\n")
        out.flush()
        kind, outcome, detail = case_of(case)
        out.write(f"{case} {outcome} {kind} {detail}".replace("\n", " ") + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
