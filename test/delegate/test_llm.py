"""LLM-shaped programs: weights shared across methods, per-method or shared KV caches, and
an encoder + decoder program, each checked against eager PyTorch on the same module."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary

from etmetal.common.weights_index import decode_index
from etmetal.examples import llm
from etmetal.runtime import Runtime
from etmetal.runtime.errors import IntegrityError

PROMPT = torch.randint(0, llm.TINY.vocab, (1, 8), generator=torch.Generator().manual_seed(1))


def _lower(model, **kwargs) -> bytes:
    return llm.lower_methods(llm.lm_exports(model), **kwargs).buffer


@pytest.fixture(scope="module")
def lm() -> llm.DecoderLM:
    return llm.make_decoder_lm()


@pytest.fixture(scope="module")
def programs(lm, tiny_lm_programs) -> dict[str, bytes]:
    """The tiny LM as two-method programs: shared weights with shared / per-method KV
    caches, and upstream's one-blob layout (no sharing key). The first and last are the
    programs ``etmetal bench llm --config tiny`` measures (lowered once per suite run, from
    a model with ``lm``'s weights); the per-method one keeps the partitioner's default."""
    from etmetal.bench.llm import program_paths

    paths = program_paths("tiny", tiny_lm_programs)
    return {
        "shared_kv": paths["shared"].read_bytes(),
        "own_kv": _lower(lm),
        "one_blob": paths["one_blob"].read_bytes(),
    }


def _load(pte: bytes):
    return Runtime.get().load_program(pte, trust_native_code=True)


def _named(pte: bytes) -> dict[str, bytes]:
    named = deserialize_pte_binary(pte).named_data
    return {k: bytes(named.buffers[e.buffer_index]) for k, e in named.pte_data.items()}


def _execute(method):
    """``method``'s first output as a (tokens, input_pos) -> logits call."""
    return lambda tokens, pos: method.execute([tokens, pos])[0]


def test_prefill_then_32_decode_steps_give_eager_tokens(lm, programs):
    want_tokens, want_logits = llm.eager_greedy(lm, PROMPT, 32)
    program = _load(programs["shared_kv"])
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    tokens, got_logits = llm.greedy_with_logits(_execute(prefill), _execute(decode), PROMPT, 32)
    assert tokens == want_tokens
    for got, want in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_program_stores_each_weight_once(lm, programs):
    named = _named(programs["own_kv"])
    weights = {k: v for k, v in named.items() if k.endswith("_weight")}
    # independent reference: the module's own tensors, by FQN (the methods wrap it as model.*)
    state = {f"model.{n}": t for n, t in [*lm.named_parameters(), *lm.named_buffers()]}
    assert len(weights) == len(state)
    for key, data in weights.items():
        fqn = key[65 : -len("_weight")]
        expected = state[fqn].detach().contiguous().numpy().tobytes()
        assert data[: len(expected)] == expected, fqn
        assert key[:64] == hashlib.sha256(data).hexdigest()
    # both methods name the same constants: one index, two .so files, nothing else
    assert sorted(k.rsplit("_", 2)[-2] for k in named if not k.endswith("_weight")) == [
        "so",
        "so",
        "weights",
    ]
    # and the upstream layout of the same program carries one blob per distinct content
    blobs = [v for k, v in _named(programs["one_blob"]).items() if k.endswith("_weights_blob")]
    assert sum(map(len, weights.values())) <= sum(map(len, blobs))


def test_methods_read_one_copy_of_each_weight_and_keep_their_own_kv_cache(programs):
    program = _load(programs["own_kv"])
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    a, b = (m._prepared.executors[0]._constants for m in (prefill, decode))
    assert a.keys() == b.keys()
    for name in a:
        same = a[name].data_ptr() == b[name].data_ptr()
        assert same == ("_cache" not in name), name


def test_kv_caches_are_per_method_unless_shared(lm, programs):
    token, pos = torch.tensor([[5]]), torch.tensor([PROMPT.shape[1]])
    with torch.no_grad():
        lm.reset_cache()
        lm(PROMPT, torch.arange(PROMPT.shape[1]))
        after_prefill = lm(token, pos)
        lm.reset_cache()
        fresh = lm(token, pos)
        lm.reset_cache()
    assert not torch.allclose(after_prefill, fresh, atol=1e-3)
    for name, want in (("own_kv", fresh), ("shared_kv", after_prefill)):
        program = _load(programs[name])
        prefill, decode = program.load_method("prefill"), program.load_method("decode")
        prefill.execute([PROMPT, torch.arange(PROMPT.shape[1])])
        torch.testing.assert_close(decode.execute([token, pos])[0], want, atol=1e-4, rtol=1e-4)


def test_a_program_without_the_sharing_key_still_loads(lm, programs):
    pte = programs["one_blob"]
    assert not any(k.endswith("_weights_index") for k in _named(pte))
    want_tokens, _ = llm.eager_greedy(lm, PROMPT, 4)
    program = _load(pte)
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    tokens = llm.greedy(
        lambda t, p: prefill.execute([t, p])[0], lambda t, p: decode.execute([t, p])[0], PROMPT, 0
    )
    assert tokens == want_tokens[:1]


def test_an_altered_shared_weight_is_refused_naming_the_constant(programs):
    pte = programs["own_kv"]
    key, data = next((k, v) for k, v in _named(pte).items() if k.endswith("lm_head.weight_weight"))
    at = pte.find(data)
    assert at >= 0
    altered = pte[: at + 8] + bytes([pte[at + 8] ^ 0x5A]) + pte[at + 9 :]
    with pytest.raises(IntegrityError, match="lm_head.weight"):
        _load(altered).load_method("decode")


def test_weights_index_errors_name_the_problem():
    with pytest.raises(ValueError, match="not JSON"):
        decode_index(b"\xff")
    with pytest.raises(ValueError, match="format"):
        decode_index(json.dumps({"format": "other"}).encode())
    bad = {"format": "etmetal-weights-index/1", "constants": [{"name": "w"}]}
    with pytest.raises(ValueError, match="constant 0 lacks"):
        decode_index(json.dumps(bad).encode())


def test_encoder_decoder_program_matches_eager():
    model = llm.make_speech_model()
    features = torch.randn(1, llm.TINY.mels, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.decoder.reset_cache()
        audio = model.encoder(features)
        want = [model.decoder(audio, torch.arange(audio.shape[1]))]
        token = int(want[0].argmax(-1))
        for i in range(4):
            pos = torch.tensor([audio.shape[1] + i])
            want.append(model.decoder(model.embed(torch.tensor([[token]])), pos))
            token = int(want[-1].argmax(-1))
        model.decoder.reset_cache()
    exports = llm.speech_exports(model)
    pte = llm.lower_methods(exports, share_weights=True, share_mutable_buffers=True).buffer
    program = _load(pte)
    encoder, embed, prefill, decode = (
        program.load_method(n) for n in ("encoder", "token_embedding", "prefill", "decode")
    )
    [got_audio] = encoder.execute([features])
    torch.testing.assert_close(got_audio, audio, atol=1e-4, rtol=1e-4)
    got = [prefill.execute([got_audio, torch.arange(got_audio.shape[1])])[0]]
    token = int(got[0].argmax(-1))
    for i in range(4):
        [embeds] = embed.execute([torch.tensor([[token]])])
        got.append(decode.execute([embeds, torch.tensor([got_audio.shape[1] + i])])[0])
        token = int(got[-1].argmax(-1))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_an_index_that_disagrees_with_the_so_is_refused_naming_the_constant(programs):
    from executorch.exir._serialize._program import serialize_pte_binary

    from etmetal.runtime.errors import DelegateError

    pte = deserialize_pte_binary(programs["own_kv"])
    named = pte.named_data
    [old_key] = [k for k in named.pte_data if k.endswith("_weights_index")]
    entry = named.pte_data.pop(old_key)
    doc = json.loads(bytes(named.buffers[entry.buffer_index]))
    victim = next(c for c in doc["constants"] if c["fqn"].endswith("lm_head.weight"))
    victim["dtype"] = 3  # int32: same size as the float32 the .so was compiled for
    index = json.dumps(doc).encode()
    new_key = hashlib.sha256(index).hexdigest() + "_weights_index"
    named.buffers.append(index)
    named.pte_data[new_key] = type(entry)(len(named.buffers) - 1, entry.alignment, None)
    for inline in pte.program.backend_delegate_data:
        inline.data = bytes(inline.data).replace(old_key.encode(), new_key.encode())
    altered = bytes(serialize_pte_binary(pte))
    with pytest.raises(DelegateError, match="lm_head_weight.*dtype code 6.*torch.int32"):
        _load(altered).load_method("decode")
