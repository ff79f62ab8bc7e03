"""Hugging Face models with small configs (random weights, built locally: no hub) lowered
with the default partitioner for ``host`` and run by etmetal's runtime, against eager.

These are programs nobody here wrote: the decoders' position ids (a cumsum over a mask),
rotary embeddings, grouped-query attention and masks as transformers exports them.
"""

from __future__ import annotations

import pytest
import torch
import transformers

SEQ = 12


# name -> (config class, model class, config arguments, input batch); transformer sizes
# shrunk to seconds of compile (one layer still carries the position ids, rotary
# embeddings, grouped-query attention and masks this test is about), vocabulary 128
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4)
MODELS = {
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(_SMALL, num_key_value_heads=2, max_position_embeddings=64),  # grouped-query
        1,
    ),
    "gpt2": (
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        dict(n_embd=64, n_layer=1, n_head=4, n_positions=64),
        1,
    ),
    "bert": (
        transformers.BertConfig,
        transformers.BertModel,
        dict(_SMALL, max_position_embeddings=64),
        2,
    ),
}


class _Logits(torch.nn.Module):
    """The model's main output as one tensor (no KV cache: one forward over the prompt)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if hasattr(self.model, "lm_head"):
            return self.model(ids, use_cache=False, return_dict=True).logits
        return self.model(ids, return_dict=True).last_hidden_state


@pytest.mark.parametrize("name", sorted(MODELS))
def test_small_hf_model_runs_whole_in_one_delegate_and_matches_eager(lowered, name):
    def build():
        torch.manual_seed(0)
        config_class, model_class, config, batch = MODELS[name]
        model = model_class(config_class(vocab_size=128, **config))
        return _Logits(model.eval()), (torch.randint(0, 128, (batch, SEQ)),)

    low = lowered(f"hf_{name}", build)
    report = low.partitioner.reports[-1]
    assert not report.kept_out, report.kept_out
    assert len(report.partitions) == 1
    with torch.no_grad():
        want = low.module(*low.inputs)
    got = low.execute(low.inputs)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# -- outside models on the emulated Metal target ------------------------------------------
# name -> (config class, model class, config arguments, example input): HF's ``eager``
# attention (matmul, scale, softmax, matmul: the pattern Inductor fuses into attention),
# the decoder's mask and position code (a cumsum), and a speech encoder's positional conv1d
# over a transposed input; lowered for mps_emulated with runtime="etmetal"
EMULATED_MODELS = {
    "llama_eager": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(_SMALL, num_key_value_heads=2, max_position_embeddings=64, vocab_size=128),
        lambda gen: torch.randint(0, 128, (1, SEQ), generator=gen),
    ),
    "wav2vec2": (
        transformers.Wav2Vec2Config,
        transformers.Wav2Vec2Model,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4,
        ),
        lambda gen: torch.randn(1, 400, generator=gen),  # 400 samples -> 39 frames
    ),
}


@pytest.mark.parametrize("name", sorted(EMULATED_MODELS))
def test_outside_hf_model_lowers_for_mps_emulated_in_one_delegate_and_matches_eager(lowered, name):
    def build():
        torch.manual_seed(0)
        config_class, model_class, config, example = EMULATED_MODELS[name]
        model = model_class(config_class(attn_implementation="eager", **config)).eval()
        assert model.config._attn_implementation == "eager"
        inputs = (example(torch.Generator().manual_seed(0)),)
        return _Logits(model), inputs, dict(target="mps_emulated", runtime="etmetal")

    low = lowered(f"hf_emulated_{name}", build)
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
