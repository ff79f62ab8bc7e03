"""Bounded slices of ExecuTorch's backend conformance suite on etmetal's three Metal flows,
compared by the suite itself against eager:

- ``metal_host``: lowered with ``MetalPartitioner(target="host")``, run by etmetal's runtime
  through the Metal delegate;
- ``metal_stock``: lowered for upstream's runtime, run by the suite's own Serialize stage
  (the stock runtime) with etmetal's native MetalBackend registered;
- ``metal_emulated``: the ``mps_emulated`` target (Inductor's Metal kernels on the emulated
  device), run by etmetal's runtime.

The three slices run in one pytest session of the suite, which collects only the operator
files that define them (a session costs a fresh interpreter's imports, and collecting the
whole suite to deselect most of it costs more). The full operator suite is
``python -m etmetal.testing.backend_suite --flows metal_host``.
"""

from __future__ import annotations

from etmetal.testing import backend_suite

# elementwise, broadcasting, pooling, matmul, conv, concatenation and layout ops
HOST_SLICE = [
    "test_add_f32_bcast_first",
    "test_abs_shapes",
    "test_avgpool2d_batch_sizes",
    "test_avgpool3d_stride",  # a window over 25: the ATen avg_pool3d fallback
    "test_lstm_bidirectional",  # oneDNN's LSTM layer, forward and reverse
    "test_adaptive_avgpool3d_output_size",  # the ATen _adaptive_avg_pool3d fallback
    "test_linear_unbatched",
    "test_conv2d_basic",
    "test_cat_negative_dim",
    "test_permute_4d",
]
# the slice's cases whose fallbacks etmetal's native MetalBackend serves in C today; it does
# not yet serve avg_pool3d, _adaptive_avg_pool3d or oneDNN's LSTM (they fail in the stock
# runtime with "shim aoti_torch_cpu_avg_pool3d is not served natively" and the like)
STOCK_SLICE = [
    name
    for name in HOST_SLICE
    if name
    not in (
        "test_avgpool3d_stride",
        "test_lstm_bidirectional",
        "test_adaptive_avgpool3d_output_size",
    )
]
# broadcasting elementwise and a matmul on the emulated Metal device: Inductor's Metal
# kernels and the device's mm fallback; one program each, since a cold emulated compile
# (Metal wrapper and MSL kernels through g++) is slow
EMULATED_SLICE = ["test_add_f32_bcast_first", "test_linear_unbatched"]

SLICES = {"metal_host": HOST_SLICE, "metal_stock": STOCK_SLICE, "metal_emulated": EMULATED_SLICE}


def _keyword(slices: dict[str, list[str]]) -> str:
    """One ``-k`` expression: each flow's cases (the flow is the first parameter of a case's
    id), without the dtype-parametrized variants."""
    per_flow = [f"({flow} and ({' or '.join(names)}))" for flow, names in slices.items()]
    return f"({' or '.join(per_flow)}) and not dtype"


def test_metal_flow_slices_pass_delegated(tmp_path):
    import executorch.backends.test.suite.flow as flow_module

    assert set(SLICES) <= set(flow_module.all_flows())
    files = backend_suite.files_defining(sorted({n for names in SLICES.values() for n in names}))
    # without the suite's per-case limits (120 s), which a cold emulated compile on a busy
    # machine can pass; this test's own limit still holds
    results = backend_suite.run_flows(
        list(SLICES), tmp_path, files=files, keyword=_keyword(SLICES), timeouts=False
    )
    for flow, names in SLICES.items():
        outcomes = results[flow]
        causes = backend_suite.failure_causes(tmp_path / "suite.xml", flow)
        delegated = backend_suite.delegated_tests(tmp_path, flow)
        print(f"{flow} slice: {len(outcomes)} cases, {len(delegated)} ran delegated; {causes}")
        # every named case ran: none was deselected by a renamed test or a dtype-only variant
        ran = {test_id.split("::")[-1].split("[")[0] for test_id in outcomes}
        assert ran == set(names), (flow, sorted(set(names) - ran))
        assert {t: v for t, v in outcomes.items() if v != "pass"} == {}, (flow, causes)
        # every pass ran a delegated program (etmetal's runtime, or the stock runtime's
        # Serialize stage for metal_stock)
        assert set(outcomes) <= delegated, (flow, sorted(set(outcomes) - delegated))
