"""Hugging Face models with small configs (``etmetal.testing.hf_models``: random weights,
built locally, no hub) lowered with the default partitioner for ``host`` and run by
etmetal's runtime, against eager.

These are programs nobody here wrote: the decoders' position ids (a cumsum over a mask),
rotary embeddings, grouped-query attention and masks as transformers exports them.
"""

from __future__ import annotations

import pytest
import torch

from etmetal.testing.hf_models import (
    EAGER_ATTENTION_MODELS,
    MODELS,
    build,
    build_eager_attention,
)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_small_hf_model_runs_whole_in_one_delegate_and_matches_eager(lowered, name):
    low = lowered(f"hf_{name}", lambda: build(name))
    report = low.partitioner.reports[-1]
    assert not report.kept_out, report.kept_out
    assert len(report.partitions) == 1
    with torch.no_grad():
        want = low.module(*low.inputs)
    got = low.execute(low.inputs)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# -- outside models on the emulated Metal target ------------------------------------------
# HF's eager attention, the decoder's mask and position code, a speech encoder's positional
# conv1d; lowered for mps_emulated with runtime="etmetal"


@pytest.mark.parametrize("name", sorted(EAGER_ATTENTION_MODELS))
def test_outside_hf_model_lowers_for_mps_emulated_in_one_delegate_and_matches_eager(lowered, name):
    def make():
        model, inputs = build_eager_attention(name)
        return model, inputs, dict(target="mps_emulated", runtime="etmetal")

    low = lowered(f"hf_emulated_{name}", make)
    report = low.partitioner.reports[-1]
    assert report.target == "mps_emulated"
    assert not report.kept_out, report.text()
    assert len(report.partitions) == 1, report.text()
    fallbacks = set(report.partitions[0].fallbacks)
    ops = report.delegated_ops
    if name == "llama_eager":
        # the mask code's cumsum is inside the one delegate, on the emulated device's shim
        assert ops["aten.cumsum.default"] >= 1 and "aoti_torch_mps_cumsum" in fallbacks
    else:
        assert ops["aten.conv1d.default"] >= 1 and "aoti_torch_mps_convolution" in fallbacks
    with torch.no_grad():
        want = low.module(*low.inputs)
    got = low.execute(low.inputs)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
