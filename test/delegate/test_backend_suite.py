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
