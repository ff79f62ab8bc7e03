"""Trust covers every byte that steers native execution: a program whose extern-node table
(or target) was replaced under an unchanged, trusted ``.so`` digest is refused at load;
the delegate digest (the ``.so``, its weights, its extern-node table and its compile specs
together) is what a user trusts."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.exir.backend.compile_spec_schema import CompileSpec

from etmetal.common.delegate_blobs import delegate_digest
from etmetal.runtime import DelegateError, Runtime, UntrustedNativeCodeError, metal_delegate
from etmetal.testing.proxy_models import LinearThenCustom
from etmetal.testing.pte_blobs import metal_delegates, named_bytes, replace_named


@pytest.fixture(autouse=True)
def _no_env_trust(monkeypatch):
    monkeypatch.delenv(metal_delegate.TRUST_ENV, raising=False)
    monkeypatch.delenv(metal_delegate.TRUSTED_BLOBS_ENV, raising=False)


@pytest.fixture
def custom(lowered):
    torch.manual_seed(3)
    return lowered("trust:linear_custom", lambda: (LinearThenCustom(), (torch.randn(2, 6),)))


def _specs(pte: bytes) -> list[tuple[str, bytes]]:
    [d] = deserialize_pte_binary(pte).program.execution_plan[0].delegates
    return [(s.key, bytes(s.value)) for s in d.compile_specs]


def _digest(pte: bytes) -> str:
    return delegate_digest(metal_delegates(pte)[0].processed, _specs(pte))


def _load(pte: bytes, hashes) -> object:
    return Runtime.get().load_program(pte, trusted_blob_hashes=hashes).load_method("forward")


def _swap_table(pte: bytes, edit) -> bytes:
    d = metal_delegates(pte)[0]
    table = json.loads(named_bytes(pte)[d.extern_nodes_key])
    edit(table)
    return replace_named(pte, {d.extern_nodes_key: json.dumps(table).encode()})


def _set_alpha(table: dict, value: float) -> None:
    [node] = [n["node"] for n in table["nodes"] if n["node"]["target"].startswith("etmtest")]
    [arg] = [a for a in node["inputs"] if a["name"] == "alpha"]
    arg["arg"] = {"as_float": value}


def test_the_delegate_digest_loads_and_runs_like_eager(custom):
    digest = _digest(custom.pte)
    with pytest.raises(UntrustedNativeCodeError) as info:
        _load(custom.pte, [])
    assert digest in str(info.value)  # the message says what to trust
    method = _load(custom.pte, [digest])
    [got] = method.execute(list(custom.inputs))
    with torch.no_grad():
        torch.testing.assert_close(got, custom.module(*custom.inputs), atol=1e-5, rtol=1e-5)
    method.destroy()


def test_a_so_digest_does_not_vouch_for_an_extern_node_table(custom):
    so_digest = metal_delegates(custom.pte)[0].keys[0][:64]
    with pytest.raises(UntrustedNativeCodeError, match="extern-node table") as info:
        _load(custom.pte, [so_digest])
    assert so_digest in str(info.value)


def test_a_table_replaced_under_the_trusted_so_is_refused_at_load(custom, tmp_path):
    d = metal_delegates(custom.pte)[0]
    so_digest, digest = d.keys[0][:64], _digest(custom.pte)
    benign = _swap_table(custom.pte, lambda t: _set_alpha(t, 3.0))  # other numbers, same .so
    assert metal_delegates(benign)[0].so == d.so  # the .so bytes are untouched
    target = tmp_path / "planted"

    def hostile_edit(table):
        [node] = [n["node"] for n in table["nodes"] if n["node"]["target"].startswith("etmtest")]
        node["target"] = "aten::from_file"
        node["inputs"] = [
            {"name": "filename", "arg": {"as_string": str(target)}},
            {"name": "shared", "arg": {"as_bool": True}},
            {"name": "size", "arg": {"as_int": 4}},
        ]

    hostile = _swap_table(custom.pte, hostile_edit)
    for pte in (benign, hostile):
        assert _digest(pte) != digest
        for hashes in ([digest], [so_digest], [digest, so_digest]):
            with pytest.raises(UntrustedNativeCodeError):
                _load(pte, hashes)
    assert not target.exists()
    # isolate mode: the worker process makes the same decision
    for pte in (benign, hostile):
        program = Runtime.get().load_program(pte, trusted_blob_hashes=[digest], isolate=True)
        with pytest.raises(DelegateError, match="native code"):
            program.load_method("forward")
    assert not target.exists()
    # trusted by its own digest, the hostile table still cannot reach from_file
    with pytest.raises(Exception, match="not on the proxy executor's allow-list"):
        _load(hostile, [_digest(hostile)])
    assert not target.exists()


def _retarget(pte: bytes, target: bytes) -> bytes:
    parsed = copy.deepcopy(deserialize_pte_binary(pte))
    [d] = parsed.program.execution_plan[0].delegates
    specs = [s for s in d.compile_specs if s.key != "target"]
    d.compile_specs = [*specs, CompileSpec("target", target)]
    return bytes(serialize_pte_binary(parsed, extract_delegate_segments=True))


def test_a_so_digest_still_vouches_for_a_plain_host_delegate_but_not_another_target(lowered):
    from etmetal.examples.metal_registry import get_model_and_inputs

    linear = lowered("registry:linear_bias", lambda: get_model_and_inputs("linear_bias"))
    so_digest = metal_delegates(linear.pte)[0].keys[0][:64]
    method = _load(linear.pte, [so_digest])  # no extern-node table, host: the .so is all
    [got] = method.execute(list(linear.inputs))
    torch.testing.assert_close(got, linear.module(*linear.inputs).detach())
    method.destroy()
    # one-blob layout (the weights index is refused for mps_emulated before trust is asked)
    one_blob = lowered(
        "registry:linear_bias:one_blob",
        lambda: (
            *get_model_and_inputs("linear_bias"),
            {"compile_specs": [CompileSpec("share_weights", b"0")]},
        ),
    )
    so_digest = metal_delegates(one_blob.pte)[0].keys[0][:64]
    _load(one_blob.pte, [so_digest]).destroy()
    moved = _retarget(one_blob.pte, b"mps_emulated")
    assert _digest(moved) != _digest(one_blob.pte)
    with pytest.raises(UntrustedNativeCodeError):
        _load(moved, [so_digest])


def test_etmetal_run_trusts_a_delegate_digest(lowered, tmp_path):
    from etmetal.examples.metal_registry import get_model_and_inputs

    linear = lowered("registry:linear_bias", lambda: get_model_and_inputs("linear_bias"))
    path = tmp_path / "linear.pte"
    path.write_bytes(linear.pte)
    digest = _digest(linear.pte)
    argv = [sys.executable, "-m", "etmetal.scripts", "run", str(path), "--runs", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETMETAL_TRUST")}
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 1 and digest in refused.stderr
    ok = subprocess.run(
        [*argv, "--trust-hash", digest], capture_output=True, text=True, timeout=300, env=env
    )
    assert ok.returncode == 0, ok.stderr
    assert "output 0: torch.float32" in ok.stdout
