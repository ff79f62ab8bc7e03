"""A bounded slice of ExecuTorch's backend conformance suite: ``etmetal`` vs ``portable``.

Both flows lower identically (no delegation) and see the same inputs (the plugin pins
the suite's seed); they differ only in the runtime that runs the ``.pte``. The full
operator suite runs with ``python -m etmetal.testing.backend_suite``.
"""

from __future__ import annotations

from etmetal.testing.backend_suite import compare, run_flows

FILES = ["test_view.py", "test_split.py", "test_adaptive_avgpool3d.py"]


def test_etmetal_flow_passes_everything_portable_passes(tmp_path):
    results = run_flows(["portable", "etmetal"], tmp_path, files=FILES)
    summary = compare(results)
    counts = summary["counts"]
    print(f"\nbackend suite slice: {counts}")
    assert counts["etmetal"]["total"] == counts["portable"]["total"] >= 10
    assert not summary["regressions"]["pass on portable, not on etmetal"]
    assert counts["etmetal"]["pass"] >= counts["portable"]["pass"]
    # the slice includes cases the stock portable kernels fail (3-D adaptive pooling)
    assert counts["etmetal"]["pass"] > counts["portable"]["pass"]
