"""A sample of the fuzz campaign's ``mps`` family (issue 24): hostile call sequences on the
emulated Metal device, each in the campaign's worker subprocesses, end in codes (named
hostile cases refused) with no crash, hang or foreign exception. ``etmetal bench fuzz
--kinds mps`` runs the family longer."""

from __future__ import annotations

import os
from collections import Counter

from etmetal.testing.fuzz import run_campaign, summary

CASES = int(os.environ.get("ETMETAL_HARDENING_MPS_FUZZ_CASES", 40))
SEED = int(os.environ.get("ETMETAL_FUZZ_SEED", 2026))


def test_hostile_mps_sequences_end_in_codes(tmp_path):
    by_kind: Counter = Counter()
    # the mps family needs no seed programs: an empty seeds directory
    counts, bad = run_campaign(tmp_path, CASES, SEED, kinds=["metal_shims"], by_kind=by_kind)
    print("\n" + summary(counts))
    assert sum(counts.values()) == CASES
    assert counts["crash"] == 0 and counts["hang"] == 0
    assert not bad, "\n".join(bad[:20])
    assert set(k for k, _ in by_kind) == {"metal_shims"} and by_kind[("metal_shims", "error")] > 0
