"""A bounded, seeded fuzz campaign over Metal-delegated programs and the shim layer.

Mutated ``.pte`` files, re-keyed constants (weights blobs, weights indexes and shared
constant entries), mutated delegate processed bytes and
random hostile shim call sequences run in worker subprocesses (``etmetal bench fuzz``
runs the same campaign longer). Every case must end in a clean etmetal error or a run;
unchanged-meaning runs must match eager; no crash, no hang.
"""

from __future__ import annotations

import os

from etmetal.testing.fuzz import build_seeds, run_campaign, summary

CASES = int(os.environ.get("ETMETAL_HARDENING_FUZZ_CASES", 1000))
SEED = int(os.environ.get("ETMETAL_FUZZ_SEED", 2026))


def test_fuzz_campaign_has_no_crash_hang_or_wrong_answer(tmp_path):
    seeds = build_seeds(tmp_path)
    counts, bad = run_campaign(seeds, CASES, SEED)
    print("\n" + summary(counts))
    assert sum(counts.values()) == CASES
    assert counts["crash"] == 0 and counts["hang"] == 0
    assert not bad, "\n".join(bad[:20])
    # the campaign reached both sides: refusals and completed runs
    assert counts["error"] > CASES // 4 and counts["correct"] + counts["ran"] > CASES // 10


def test_operator_table_family_sample_has_no_bad_case():
    """A small sample of the ``operators`` family in this process (the campaign runs it in
    workers: ``etmetal bench fuzz --family operators``): programs naming random table,
    outside, dangerous and garbage operators; every case a clean refusal or a run."""
    import random
    from collections import Counter

    from etmetal.testing import fuzz_operators

    pools = fuzz_operators.Pools()
    assert "aten::from_file" in pools.outside and "aten::add.out" in pools.table
    counts: Counter = Counter()
    bad = []
    for case in range(40):
        kind, outcome, detail = fuzz_operators.run_case(pools, random.Random(SEED + case), case)
        counts[outcome] += 1
        if outcome == "BAD":
            bad.append(f"{case} {kind} {detail}")
    assert not bad, "\n".join(bad[:10])
    assert counts["error"] > 20  # the refusals were reached
