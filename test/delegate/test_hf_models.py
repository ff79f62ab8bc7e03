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


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg), (torch.randint(0, 128, (1, SEQ)),)


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg), (torch.randint(0, 128, (1, SEQ)),)


def _bert():
    cfg = transformers.BertConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    return transformers.BertModel(cfg), (torch.randint(0, 128, (2, SEQ)),)


class _Logits(torch.nn.Module):
    """The model's main output as one tensor (no KV cache: one forward over the prompt)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if hasattr(self.model, "lm_head"):
            return self.model(ids, use_cache=False, return_dict=True).logits
        return self.model(ids, return_dict=True).last_hidden_state


@pytest.mark.parametrize("make", [_llama, _gpt2, _bert], ids=["llama", "gpt2", "bert"])
def test_small_hf_model_runs_whole_in_one_delegate_and_matches_eager(lowered, make):
    def build():
        torch.manual_seed(0)
        model, inputs = make()
        return _Logits(model.eval()), inputs

    low = lowered(f"hf_{make.__name__}", build)
    report = low.partitioner.reports[-1]
    assert not report.kept_out, report.kept_out
    assert len(report.partitions) == 1
    with torch.no_grad():
        want = low.module(*low.inputs)
    got = low.execute(low.inputs)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
