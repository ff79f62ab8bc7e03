"""The fuzz campaign's shim sequences on both shim implementations (issue 25): the hostile
``shim`` and ``metal_shims`` sequences run, from one seed, on the native implementation and
on the Python reference in the campaign's worker subprocesses; every call must return the
same code on both and neither may crash. A sample here; ``etmetal bench fuzz --kinds
shim,metal_shims`` runs the family longer."""

from __future__ import annotations

import ctypes
import os
import random
from collections import Counter

from etmetal.shims import c_api, default_context, memory_stats
from etmetal.testing.fuzz import run_campaign, summary
from etmetal.testing.fuzz_both import on_both_implementations

CASES = int(os.environ.get("ETMETAL_HARDENING_SHIM_FUZZ_CASES", 120))
SEED = int(os.environ.get("ETMETAL_FUZZ_SEED", 2026))


def test_shim_sequences_give_the_same_codes_on_both_implementations(tmp_path):
    by_kind: Counter = Counter()
    # the shim kinds need no seed programs: an empty seeds directory
    counts, bad = run_campaign(
        tmp_path, CASES, SEED + 1, kinds=["shim", "metal_shims"], by_kind=by_kind
    )
    print("\n" + summary(counts))
    assert sum(counts.values()) == CASES
    assert counts["crash"] == 0 and counts["hang"] == 0
    assert not bad, "\n".join(bad[:20])
    # both kinds ran, and their hostile calls were refused (on both: the codes agreed)
    assert by_kind[("shim", "error")] > 0 and by_kind[("metal_shims", "error")] > 0


def _hostile(rng: random.Random, codes: list) -> tuple[str, str]:
    """A short hostile sequence through the C shims: a bad dtype, a NULL out-pointer, a
    view past its storage, a double delete."""
    lib = c_api()
    i64 = ctypes.c_int64
    sizes, strides = (i64 * 2)(2, 3), (i64 * 2)(3, 1)
    h, v = ctypes.c_void_p(), ctypes.c_void_p()
    codes.append(
        ("bad dtype", lib.aoti_torch_empty_strided(2, sizes, strides, 77, 0, 0, ctypes.byref(h)))
    )
    codes.append(("null out", lib.aoti_torch_empty_strided(2, sizes, strides, 6, 0, 0, None)))
    codes.append(
        ("empty", lib.aoti_torch_empty_strided(2, sizes, strides, 6, 0, 0, ctypes.byref(h)))
    )
    offset = rng.choice([5, 7])  # past the end of 6 elements either way
    codes.append(
        ("view", lib.aoti_torch__reinterpret_tensor(h, 2, sizes, strides, offset, ctypes.byref(v)))
    )
    codes.append(("delete", lib.aoti_torch_delete_tensor_object(h)))
    codes.append(("double delete", lib.aoti_torch_delete_tensor_object(h)))
    return "error", ""


def test_both_implementations_refuse_the_same_hostile_calls():
    before = memory_stats().live()
    outcome, detail = on_both_implementations(_hostile, SEED)
    assert outcome == "error" and "native/python: 6 calls agree" in detail, detail
    assert memory_stats().live() == before


def test_a_code_that_differs_between_the_implementations_is_a_bad_case():
    ctx = default_context()

    def differs(rng: random.Random, codes: list) -> tuple[str, str]:
        _hostile(rng, codes)
        # what a bug in one implementation looks like: one call answered differently
        codes[3] = ("view", int(ctx.implementation == "python"))
        return "error", ""

    outcome, detail = on_both_implementations(differs, SEED)
    assert outcome == "BAD" and detail.startswith("call 3: native view -> 0, python view -> 1")
