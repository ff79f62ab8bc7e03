"""The weights index is read in C by a small strict JSON reader: every malformed index (its
entry rehashed, so the integrity check passes and the reader is what is tested) is refused
at load with a message naming the problem, never a crash or a wrong answer; so are
processed bytes that are not a Metal delegate's key lines."""

from __future__ import annotations

import gc
import json

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock
from etmetal.testing.pte_blobs import metal_delegates, replace_named


def _linear():
    torch.manual_seed(2)
    return torch.nn.Linear(8, 4), (torch.randn(3, 8),)


def _edit(index: bytes, edit) -> bytes:
    doc = json.loads(index)
    edit(doc)
    return json.dumps(doc).encode()


def _set(field, value):
    def edit(doc):
        doc["constants"][0][field] = value

    return edit


CASES = {
    "not_json": (lambda ix: ix[: len(ix) // 2], "weights index is not JSON"),
    "trailing": (lambda ix: ix + b" x", "weights index is not JSON"),
    "float": (lambda ix: _edit(ix, _set("offset", 1.5)), "only integers are expected"),
    "huge_int": (
        lambda ix: ix.replace(b'"offset":0', b'"offset":99999999999999999999', 1),
        "integer out of range",
    ),
    "deep": (
        lambda ix: ix.replace(b'"format"', b'"x":' + b"[" * 40 + b"]" * 40 + b',"format"', 1),
        "nested too deeply",
    ),
    "format": (lambda ix: _edit(ix, lambda d: d.update(format="other/1")), "another format"),
    "no_list": (lambda ix: _edit(ix, lambda d: d.pop("constants")), "no 'constants' list"),
    "missing": (lambda ix: _edit(ix, lambda d: d["constants"][0].pop("nbytes")), "lacks 'nbytes'"),
    "negative": (lambda ix: _edit(ix, _set("shape", [-1, 8])), "non-negative"),
    "rank": (lambda ix: _edit(ix, _set("stride", [1])), "of one rank"),
    "key": (lambda ix: _edit(ix, _set("key", "abc_weight")), "is not '<sha256>_<fqn>_weight'"),
    "flag": (lambda ix: _edit(ix, _set("mutable", 1)), "mutable must be true or false"),
    "twice": (
        lambda ix: _edit(ix, lambda d: d["constants"].append(dict(d["constants"][0]))),
        "twice",
    ),
    "too_big": (lambda ix: _edit(ix, _set("shape", [400, 8])), "do not hold its shape"),
    "repeated_key": (
        lambda ix: ix.replace(b'"offset":0', b'"offset":0,"offset":8', 1),
        "key 'offset' is written twice",
    ),
    "bad_escape": (lambda ix: ix.replace(b'"name":"', b'"name":"\\q', 1), "bad escape"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_index_is_refused_naming_the_problem(case, stock_lowered, trusted):
    low = stock_lowered("index:linear", _linear)
    d = metal_delegates(low.pte)[0]
    assert d.layout == "shared"
    mutate, expected = CASES[case]
    index = mutate(d.weights.replace(b", ", b",").replace(b": ", b":"))
    pte = replace_named(low.pte, {d.keys[1]: index})
    with pytest.raises(RuntimeError):
        Runtime.get().load_program(pte).load_method("forward")
    gc.collect()
    assert expected in stock.last_error()
    counts = stock.native_counts()
    assert (counts["delegates"], counts["live"]) == (0, 0)


def test_the_unmodified_index_loads(stock_lowered, trusted):
    low = stock_lowered("index:linear", _linear)
    [got] = Runtime.get().load_program(low.pte).load_method("forward").execute(list(low.inputs))
    with torch.no_grad():
        torch.testing.assert_close(got, low.module(*low.inputs), atol=1e-5, rtol=1e-5)


PROCESSED = {
    "one_line": lambda p: p.split(b"\n")[0],
    "four_lines": lambda p: p + b"\n" + p.split(b"\n")[0],
    "not_hex": lambda p: b"z" + p[1:],
    "empty": lambda p: b"",
    "wrong_suffix": lambda p: p.replace(b"_so_blob", b"_so_blab", 1),
}


@pytest.mark.parametrize("case", list(PROCESSED))
def test_processed_bytes_that_are_not_key_lines_are_refused(case, stock_lowered, trusted):
    low = stock_lowered("index:linear", _linear)
    parsed = deserialize_pte_binary(low.pte)
    [d] = parsed.program.execution_plan[0].delegates
    inline = parsed.program.backend_delegate_data[d.processed.index]
    inline.data = PROCESSED[case](bytes(inline.data))
    pte = bytes(serialize_pte_binary(parsed, extract_delegate_segments=True))
    with pytest.raises(RuntimeError):
        Runtime.get().load_program(pte).load_method("forward")
    gc.collect()
    assert "processed bytes are not a Metal AOTI blob reference" in stock.last_error()
    assert stock.native_counts()["delegates"] == 0
