"""Through the stock runtime, etmetal's native MetalBackend refuses what etmetal's runtime
refuses: untrusted native code (with how to opt in), blobs that do not match their keys,
a target other than ``host`` and an extern-node table that does not match its key; each opt-in of
the trust policy loads the program, and a later ``register`` call changes the policy."""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock
from etmetal.common.delegate_blobs import delegate_digest
from etmetal.testing.proxy_models import LinearThenCustom
from etmetal.testing.pte_blobs import metal_delegates, replace_named

TRUST_ENV, BLOBS_ENV = "ETMETAL_TRUST_NATIVE_CODE", "ETMETAL_TRUSTED_BLOBS"


@pytest.fixture(autouse=True)
def _policy(monkeypatch):
    """No trust from the environment; each test starts and ends with the default policy."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    monkeypatch.delenv(BLOBS_ENV, raising=False)
    stock.register()
    yield
    gc.collect()
    stock.register()


def _linear():
    torch.manual_seed(2)
    return torch.nn.Linear(8, 4), (torch.randn(3, 8),)


def _private_dirs() -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"etmetal-stock-{os.getpid()}-*"))


def _load(pte: bytes):
    return Runtime.get().load_program(pte).load_method("forward")


def _digest(pte: bytes) -> str:
    [d] = deserialize_pte_binary(pte).program.execution_plan[0].delegates
    specs = [(s.key, bytes(s.value)) for s in d.compile_specs]
    return delegate_digest(metal_delegates(pte)[0].processed, specs)


def _refused(pte: bytes) -> str:
    before = _private_dirs()
    with pytest.raises(RuntimeError):
        _load(pte)
    assert _private_dirs() == before  # nothing left behind
    assert stock.native_counts()["delegates"] == 0
    return stock.last_error()


def _flip(pte: bytes, blob: bytes) -> bytes:
    start = pte.find(blob)
    assert start >= 0 and pte.find(blob, start + 1) < 0
    pos = start + len(blob) // 2
    return pte[:pos] + bytes([pte[pos] ^ 0x5A]) + pte[pos + 1 :]


def test_untrusted_program_is_refused_with_how_to_opt_in(stock_lowered):
    low = stock_lowered("trust:linear", _linear)
    message = _refused(low.pte)
    for hint in (
        "trust_native_code=True",
        "trusted_blob_hashes",
        _digest(low.pte),
        "ETMETAL_TRUST_NATIVE_CODE=1",
        "method 'forward'",
    ):
        assert hint in message


@pytest.mark.parametrize("how", ["flag", "digest", "so_digest", "env", "env_digest"])
def test_each_opt_in_loads_and_runs_the_program(how, stock_lowered, monkeypatch):
    low = stock_lowered("trust:linear", _linear)
    digest = _digest(low.pte)
    if how == "flag":
        stock.register(trust_native_code=True)
    elif how == "digest":
        stock.register(trusted_blob_hashes=[digest.upper()])
    elif how == "so_digest":  # a host delegate without an extern-node table: the .so is all
        stock.register(trusted_blob_hashes=[metal_delegates(low.pte)[0].keys[0]])
    elif how == "env":
        monkeypatch.setenv(TRUST_ENV, "1")
    else:
        monkeypatch.setenv(BLOBS_ENV, f"0000,{digest}")
    [got] = _load(low.pte).execute(list(low.inputs))
    with torch.no_grad():
        torch.testing.assert_close(got, low.module(*low.inputs), atol=1e-5, rtol=1e-5)


def test_a_later_register_call_changes_the_policy(stock_lowered):
    low = stock_lowered("trust:linear", _linear)
    stock.register(trust_native_code=True)
    _load(low.pte)
    stock.register()
    assert "trust_native_code=True" in _refused(low.pte)


@pytest.mark.parametrize("which", ["so", "weights", "constant"])
def test_a_blob_that_does_not_match_its_key_is_refused(which, stock_lowered):
    low = stock_lowered("trust:linear", _linear)
    d = metal_delegates(low.pte)[0]
    if which == "constant":
        [key] = [c["key"] for c in d.index if c["fqn"].endswith("weight")]
        blob = d.constants[key]
    else:
        key, blob = (d.keys[0], d.so) if which == "so" else (d.keys[1], d.weights)
    stock.register(trust_native_code=True)
    message = _refused(_flip(low.pte, blob))
    assert "does not match its key" in message and key in message


def test_an_extern_node_table_that_does_not_match_its_key_is_refused(stock_lowered):
    torch.manual_seed(3)
    low = stock_lowered("trust:custom", lambda: (LinearThenCustom(), (torch.randn(2, 6),)))
    d = metal_delegates(low.pte)[0]
    assert d.extern_nodes_key is not None
    table = [v for k, v in _named(low.pte).items() if k == d.extern_nodes_key][0]
    stock.register(trust_native_code=True)
    message = _refused(_flip(low.pte, table))
    assert "extern-node table blob does not match its key" in message
    # intact and trusted, it runs: the native proxy executor serves the table's operator
    [got] = _load(low.pte).execute(list(low.inputs))
    with torch.no_grad():
        torch.testing.assert_close(got, low.module(*low.inputs), atol=1e-5, rtol=1e-5)
    # and a .so digest never vouches for a delegate with a table
    stock.register(trusted_blob_hashes=[d.keys[0][:64]])
    assert "extern-node table" in _refused(low.pte)


def _named(pte: bytes) -> dict[str, bytes]:
    named = deserialize_pte_binary(pte).named_data
    return {k: bytes(named.buffers[e.buffer_index]) for k, e in named.pte_data.items()}


def _retargeted(pte: bytes, target: bytes) -> bytes:
    parsed = deserialize_pte_binary(pte)
    [d] = parsed.program.execution_plan[0].delegates
    [spec] = [s for s in d.compile_specs if s.key == "target"]
    spec.value = target
    return bytes(serialize_pte_binary(parsed, extract_delegate_segments=True))


def test_a_target_the_backend_cannot_run_is_refused_naming_what_to_do(stock_lowered):
    low = stock_lowered("trust:linear", _linear)
    stock.register(trust_native_code=True)
    # mps needs macOS and ExecuTorch's Metal runtime: the message says so, and what runs here
    message = _refused(_retargeted(low.pte, b"mps"))
    assert "'mps'" in message and "macOS" in message and "'mps_emulated'" in message
    # a host .so relabelled mps_emulated carries a weights index, which no mps delegate has
    message = _refused(_retargeted(low.pte, b"mps_emulated"))
    assert "'mps_emulated'" in message and "weights index" in message


def test_a_mismatched_index_is_refused_naming_the_constant(stock_lowered):
    low = stock_lowered("trust:linear", _linear)
    d = metal_delegates(low.pte)[0]
    index = d.weights.replace(b'"dtype":6', b'"dtype":7', 1)
    assert index != d.weights
    stock.register(trust_native_code=True)
    message = _refused(replace_named(low.pte, {d.keys[1]: index}))
    assert "dtype code" in message


def test_the_so_lives_in_a_private_directory_removed_with_its_method(stock_lowered):
    low = stock_lowered("trust:linear", _linear)
    stock.register(trust_native_code=True)
    before = _private_dirs()
    method = _load(low.pte)
    [d] = [p for p in _private_dirs() if p not in before]
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    # the .so, and the link wrapper that binds it to this library
    assert sorted(p.name for p in d.iterdir()) == ["delegate.so", "libetmetal_link.so"]
    del method
    gc.collect()
    assert not d.exists()


def test_a_method_never_destroyed_leaves_no_directory_at_exit(stock_lowered, tmp_path):
    low = stock_lowered("trust:linear", _linear)
    (tmp_path / "model.pte").write_bytes(low.pte)
    code = (
        "import os, sys, etmetal.stock_runtime as s\n"
        "from executorch.runtime import Runtime\n"
        "s.register(trust_native_code=True)\n"
        "m = Runtime.get().load_program('model.pte').load_method('forward')\n"
        "print(len([p for p in os.listdir(os.environ['TMPDIR']) if p.startswith('etmetal-stock')]))\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    src = str(Path(stock.__file__).parents[2])  # this checkout's etmetal
    path = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "1"  # it was there while the method lived
    assert not [p for p in os.listdir(tmp) if p.startswith("etmetal-stock")]


_CHILD_LOAD = (
    "import sys, etmetal.stock_runtime as s\n"
    "from executorch.runtime import Runtime\n"
    "s.register(trust_native_code=True)\n"
    "try:\n"
    "    Runtime.get().load_program(open(sys.argv[1], 'rb').read()).load_method('forward')\n"
    "except RuntimeError:\n"
    "    sys.stdout.buffer.write(s.last_error().encode())\n"
    "else:\n"
    "    print('loaded')\n"
)


@pytest.mark.parametrize("where", ["so_key", "constant_name"])
def test_a_message_quoting_bytes_that_are_not_utf8_is_printable_ascii(
    where, stock_lowered, tmp_path
):
    # the pybind log sink decodes each message as UTF-8: a raw 0xff in one aborted the
    # process (SIGABRT), so the load runs in a child that must exit normally
    low = stock_lowered("trust:linear", _linear)
    d = metal_delegates(low.pte)[0]
    if where == "so_key":  # "<sha256>_\xff\xfe_so_blob": a well-formed key naming nothing
        parsed = deserialize_pte_binary(low.pte)
        [inline] = parsed.program.backend_delegate_data
        so_key, rest = bytes(inline.data).split(b"\n", 1)
        inline.data = so_key[:65] + b"\xff\xfe" + so_key[64:] + b"\n" + rest
        pte = bytes(serialize_pte_binary(parsed, extract_delegate_segments=True))
    else:  # the (re-keyed) weights index: raw bytes in a constant's fqn, a wrong size
        entry = d.index[0]
        fqn, size = f'"fqn":"{entry["fqn"]}"'.encode(), f'"nbytes":{entry["nbytes"]}'.encode()
        index = d.weights.replace(fqn, fqn[:-1] + b'\xff\xfe"', 1)
        index = index.replace(size, size + b"0", 1)
        assert index.count(b"\xff\xfe") == 1 and index.count(size + b"0") == 1
        pte = replace_named(low.pte, {d.keys[1]: index})
    (tmp_path / "model.pte").write_bytes(pte)
    src = str(Path(stock.__file__).parents[2])  # this checkout's etmetal
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD_LOAD, str(tmp_path / "model.pte")],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    message = proc.stdout.strip()
    assert message and message != b"loaded"
    assert all(0x20 <= c < 0x7F for c in message), message  # printable ASCII only
    assert b"\\xff\\xfe" in message  # the bad bytes are named, escaped
    assert b"MetalBackend delegate" in message
