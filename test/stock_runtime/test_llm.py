"""The two-method LM through the stock runtime: prefill, then 32 greedy decode tokens equal to
eager's, with one copy of each weight lent to both methods' containers."""

from __future__ import annotations

import gc

import pytest
import torch
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock
from etmetal.examples import llm

PROMPT = torch.randint(0, llm.TINY.vocab, (1, 8), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def lm() -> llm.DecoderLM:
    return llm.make_decoder_lm()


@pytest.fixture(scope="module")
def programs(lm) -> dict[str, bytes]:
    return {  # each lowering exports afresh (lowering consumes the exported programs)
        "own_kv": llm.lower_methods(llm.lm_exports(lm)).buffer,
        "shared_kv": llm.lower_methods(llm.lm_exports(lm), share_mutable_buffers=True).buffer,
    }


def _execute(method):
    """``method``'s first output as a (tokens, input_pos) -> logits call."""
    return lambda tokens, pos: method.execute([tokens, pos])[0]


def test_prefill_then_32_decode_steps_give_eager_tokens(lm, programs, trusted):
    want_tokens, want_logits = llm.eager_greedy(lm, PROMPT, 32)
    program = Runtime.get().load_program(programs["shared_kv"])
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    tokens, got_logits = llm.greedy_with_logits(_execute(prefill), _execute(decode), PROMPT, 32)
    assert tokens == want_tokens
    for got, want in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_methods_lend_one_copy_of_each_weight_and_keep_their_own_kv_cache(programs, trusted):
    gc.collect()
    base = stock.native_counts()["shared_entries"]
    program = Runtime.get().load_program(programs["own_kv"])
    prefill = program.load_method("prefill")
    after_prefill = stock.native_counts()["shared_entries"]
    decode = program.load_method("decode")
    # decode names the same weights: no entry of the shared cache is added for it
    assert stock.native_counts()["shared_entries"] == after_prefill > base
    lent = stock.lent_constants()
    by_method: dict[str, dict[str, stock.LentConstant]] = {}
    for c in lent:
        by_method.setdefault(c.where.split("'")[1], {})[c.key] = c
    prefill_keys, decode_keys = by_method["prefill"], by_method["decode"]
    common = set(prefill_keys) & set(decode_keys)
    weights = [k for k in common if not prefill_keys[k].mutable]
    caches = [k for k in common if prefill_keys[k].mutable]
    assert weights and caches
    for key in weights:  # one copy of each weight
        assert prefill_keys[key].address == decode_keys[key].address, key
    for key in caches:  # a KV cache per method, as the exported methods declare
        assert prefill_keys[key].address != decode_keys[key].address, key
    del prefill, decode, program
    gc.collect()
    assert stock.native_counts()["shared_entries"] == base


def test_shared_mutable_buffers_are_one_copy(programs, trusted):
    program = Runtime.get().load_program(programs["shared_kv"])
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    lent = stock.lent_constants()
    caches: dict[str, set[int]] = {}
    for c in lent:
        if c.mutable:
            caches.setdefault(c.name, set()).add(c.address)
    assert caches and all(len(a) == 1 for a in caches.values())
    del prefill, decode, program
    gc.collect()


# -- the same LM lowered for the emulated Metal device ------------------------------------
# One weights blob per partition (upstream's layout, the only one an mps program has): the
# backend lays it out once per program as the device image the container would build and
# lends it to both methods' containers; the KV caches (buffers) stay per method.


@pytest.fixture(scope="module")
def mps_programs(lm) -> dict[str, bytes]:
    def lower(**kw):  # for etmetal's runtimes: the stock backend shares buffers on request
        return llm.lower_methods(llm.lm_exports(lm), target="mps_emulated", runtime="etmetal", **kw)

    return {"own_kv": lower().buffer, "shared_kv": lower(share_mutable_buffers=True).buffer}


def test_mps_prefill_then_32_decode_steps_give_eager_tokens_with_weights_shared(
    lm, mps_programs, trusted
):
    want_tokens, want_logits = llm.eager_greedy(lm, PROMPT, 32)
    gc.collect()
    base = stock.native_counts()["shared_entries"]
    program = Runtime.get().load_program(mps_programs["shared_kv"])
    prefill = program.load_method("prefill")
    after_prefill = stock.native_counts()["shared_entries"]
    decode = program.load_method("decode")
    assert stock.native_counts()["shared_entries"] == after_prefill == base + 1
    by_method: dict[str, dict[str, stock.LentConstant]] = {}
    for c in stock.lent_constants():
        by_method.setdefault(c.where.split("'")[1], {})[c.name] = c
    prefill_lent, decode_lent = by_method["prefill"], by_method["decode"]
    common = set(prefill_lent) & set(decode_lent)
    assert any(c.mutable for c in prefill_lent.values())
    for name in common:  # one copy of each weight and (shared) KV cache, read by both
        assert prefill_lent[name].address == decode_lent[name].address, name
    tokens, got_logits = llm.greedy_with_logits(_execute(prefill), _execute(decode), PROMPT, 32)
    assert tokens == want_tokens
    for got, want in zip(got_logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    del prefill, decode, program
    gc.collect()
    counts = stock.native_counts()
    assert counts["shared_entries"] == base
    assert (counts["delegates"], counts["live"], counts["mps_storages"]) == (0, 0, 0), counts


def test_mps_methods_keep_their_own_kv_cache_unless_shared(mps_programs, trusted):
    program = Runtime.get().load_program(mps_programs["own_kv"])
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    by_method: dict[str, dict[str, stock.LentConstant]] = {}
    for c in stock.lent_constants():
        by_method.setdefault(c.where.split("'")[1], {})[c.name] = c
    common = set(by_method["prefill"]) & set(by_method["decode"])
    weights = [n for n in common if not by_method["prefill"][n].mutable]
    caches = [n for n in common if by_method["prefill"][n].mutable]
    assert weights and caches
    for name in weights:
        assert by_method["prefill"][name].address == by_method["decode"][name].address, name
    for name in caches:  # a KV cache per method, as the exported methods declare
        assert by_method["prefill"][name].address != by_method["decode"][name].address, name
    del prefill, decode, program
    gc.collect()


def test_etmetals_runtime_refuses_shared_buffers_it_would_keep_per_method(mps_programs):
    # etmetal's Python runtime keeps an emulated-Metal container's buffers per method: a
    # program that asks for one KV cache must not silently get two there
    from etmetal.runtime import Runtime as EtmetalRuntime

    program = EtmetalRuntime.get().load_program(mps_programs["shared_kv"], trust_native_code=True)
    with pytest.raises(Exception, match="share_mutable_buffers") as refused:
        program.load_method("prefill")
    assert "etmetal.stock_runtime.register()" in str(refused.value)
