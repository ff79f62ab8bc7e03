"""A bounded slice of ExecuTorch's backend conformance suite on the ``metal_host`` flow:
lowered with ``MetalPartitioner(target="host")``, run by etmetal's runtime through the
Metal delegate, compared by the suite itself against eager. The full operator suite is
``python -m etmetal.testing.backend_suite --flows metal_host``."""

from __future__ import annotations

from etmetal.testing import backend_suite

# elementwise, broadcasting, pooling, matmul, conv, concatenation and layout ops
SLICE = (
    "("
    + " or ".join(
        [
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
    )
    + ") and not dtype"
)


def test_metal_host_flow_slice_passes_delegated(tmp_path):
    results = backend_suite.run_flows(["metal_host"], tmp_path, keyword=SLICE)["metal_host"]
    delegated = backend_suite.delegated_tests(tmp_path, "metal_host")
    failed = {t: v for t, v in results.items() if v == "fail"}
    causes = backend_suite.failure_causes(tmp_path / "suite.xml", "metal_host")
    print(f"metal_host slice: {len(results)} cases, {len(delegated)} ran delegated; {causes}")
    assert len(results) >= 10
    assert failed == {}, causes
    passed = {t for t, v in results.items() if v == "pass"}
    # every pass ran a delegated program through etmetal's runtime
    assert passed and passed <= delegated


# the slice's cases whose fallbacks etmetal's native MetalBackend serves in C today; it does
# not yet serve avg_pool3d, _adaptive_avg_pool3d or oneDNN's LSTM (they fail in the stock
# runtime with "shim aoti_torch_cpu_avg_pool3d is not served natively" and the like)
STOCK_SLICE = (
    "("
    + " or ".join(
        [
            "test_add_f32_bcast_first",
            "test_abs_shapes",
            "test_avgpool2d_batch_sizes",
            "test_linear_unbatched",
            "test_conv2d_basic",
            "test_cat_negative_dim",
            "test_permute_4d",
        ]
    )
    + ") and not dtype"
)


def test_metal_stock_flow_slice_passes_delegated_in_the_stock_runtime(tmp_path):
    """``metal_stock``: lowered for upstream's runtime, run by the suite's own Serialize stage
    (the stock runtime) with etmetal's native MetalBackend registered."""
    import executorch.backends.test.suite.flow as flow_module

    assert "metal_stock" in flow_module.all_flows()
    results = backend_suite.run_flows(["metal_stock"], tmp_path, keyword=STOCK_SLICE)
    results = results["metal_stock"]
    causes = backend_suite.failure_causes(tmp_path / "suite.xml", "metal_stock")
    assert len(results) >= 7
    assert {t: v for t, v in results.items() if v != "pass"} == {}, causes
    assert set(results) <= backend_suite.delegated_tests(tmp_path, "metal_stock")


# broadcasting elementwise and a matmul on the emulated Metal device: Inductor's Metal
# kernels and the device's mm fallback; one program each, since a cold emulated compile
# (Metal wrapper and MSL kernels through g++) is slow
EMULATED_SLICE = "(test_add_f32_bcast_first or test_linear_unbatched) and not dtype"


def test_metal_emulated_flow_slice_passes_delegated_on_the_emulated_device(tmp_path):
    """``metal_emulated``: the ``mps_emulated`` target, run by etmetal's runtime; the suite
    compares against eager itself. Without the suite's per-case limits (120 s, which a cold
    emulated compile on a busy machine can pass)."""
    import executorch.backends.test.suite.flow as flow_module

    assert "metal_emulated" in flow_module.all_flows()
    results = backend_suite.run_flows(
        ["metal_emulated"], tmp_path, keyword=EMULATED_SLICE, timeouts=False
    )
    results = results["metal_emulated"]
    causes = backend_suite.failure_causes(tmp_path / "suite.xml", "metal_emulated")
    assert len(results) >= 2
    assert {t: v for t, v in results.items() if v != "pass"} == {}, causes
    assert set(results) <= backend_suite.delegated_tests(tmp_path, "metal_emulated")
