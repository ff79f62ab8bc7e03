"""Programs whose ``.so`` calls operators without a C shim, through the stock ExecuTorch
runtime with etmetal's native MetalBackend: the extern-node table is verified against its
key, parsed once by the native proxy executor, and its operators run in C; the outputs
match eager and etmetal's own runtime; a tampered table is refused; the Python-free
runner runs such a program (``--proxy-lib``) and refuses an operator it does not have."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock
from etmetal.runtime import Runtime as EtmetalRuntime
from etmetal.stock_runtime import runner
from etmetal.testing import proxy_models
from etmetal.testing.pte_blobs import metal_delegates

sys.path.insert(0, str(Path(__file__).parent))
from conftest import fresh_like  # noqa: E402


class AtenOnly(torch.nn.Module):
    """Only ATen operators, one without a C shim: what a process without Python can run."""

    def forward(self, x):
        y = torch.nn.functional.interpolate(x, size=(7, 9), mode="bicubic", antialias=True)
        return y.tanh() + 1


def _upsampler():
    torch.manual_seed(4)
    return proxy_models.Upsampler(), (torch.randn(1, 3, 5, 6),)


def _aten_only():
    return AtenOnly(), (torch.randn(1, 2, 4, 5),)


def _eager(low, inputs):
    with torch.no_grad():
        return low.module(*inputs)


def _has_table(pte: bytes) -> bool:
    [d] = metal_delegates(pte)
    return d.extern_nodes_key is not None


@pytest.mark.parametrize("make", [_upsampler, _aten_only], ids=["custom_op", "aten_only"])
def test_an_extern_node_program_matches_eager_and_etmetals_runtime(make, stock_lowered, trusted):
    low = stock_lowered(f"proxy:{make.__name__}", make)
    assert _has_table(low.pte) and low.partitioner.report.kept_out == []
    reference = EtmetalRuntime.get().load_program(low.pte, trust_native_code=True)
    ours = reference.load_method("forward")
    before = stock.native_counts()["python_calls"]
    for seed in (0, 1, 2):
        inputs = low.inputs if seed == 0 else fresh_like(low.inputs, seed)
        [got] = low.execute(inputs)
        torch.testing.assert_close(got, _eager(low, inputs), atol=1e-5, rtol=1e-5)
        [theirs] = ours.execute(list(inputs))
        assert torch.equal(got, theirs)  # the same kernels, the same operators, bit for bit
    assert stock.native_counts()["python_calls"] == before  # no shim reached Python


def test_executes_leave_the_native_storage_counts_at_their_steady_value(stock_lowered, trusted):
    low = stock_lowered("proxy:_upsampler", _upsampler)
    method = Runtime.get().load_program(low.pte).load_method("forward")
    method.execute(list(low.inputs))
    steady = stock.native_counts()
    for _ in range(20):
        method.execute(list(low.inputs))
    after = stock.native_counts()
    for key in ("live", "stores", "bytes", "borrowed"):
        assert after[key] == steady[key], (key, steady, after)
    del method
    gc.collect()


def _flip(pte: bytes, blob: bytes) -> bytes:
    start = pte.find(blob)
    assert start >= 0 and pte.find(blob, start + 1) < 0
    pos = start + len(blob) // 2
    return pte[:pos] + bytes([pte[pos] ^ 0x5A]) + pte[pos + 1 :]


def test_a_tampered_extern_node_table_is_refused(stock_lowered, trusted):
    low = stock_lowered("proxy:_upsampler", _upsampler)
    [d] = metal_delegates(low.pte)
    named = deserialize_pte_binary(low.pte).named_data
    entry = named.pte_data[d.extern_nodes_key]
    table = bytes(named.buffers[entry.buffer_index])
    assert b"etmtest_native::shift_scale" in table
    with pytest.raises(RuntimeError):
        Runtime.get().load_program(_flip(low.pte, table)).load_method("forward")
    message = stock.last_error()
    assert "extern-node table blob does not match its key" in message
    assert d.extern_nodes_key in message


@pytest.fixture(scope="module")
def aten_only_pte(tmp_path_factory) -> tuple[torch.nn.Module, tuple, Path]:
    from etmetal.backend.lowering import lower

    module, inputs = _aten_only()
    program, _ = lower(module.eval(), inputs, target="host")
    path = tmp_path_factory.mktemp("runner-proxy") / "aten_only.pte"
    path.write_bytes(program.buffer)
    return module, inputs, path


def test_the_runner_runs_an_extern_node_program_without_python(aten_only_pte, tmp_path):
    module, inputs, path = aten_only_pte
    maps = tmp_path / "maps"
    result = runner.run_runner(path, list(inputs), trust_native_code=True, dump_maps=maps)
    with torch.no_grad():
        want = module(*inputs)
    [got] = result.outputs
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    fields = (line.split() for line in maps.read_text().splitlines())
    mapped = {Path(f[5]).name for f in fields if len(f) >= 6}
    assert "libetmetal_proxy.so" in mapped  # the table's operator ran in this process
    assert sorted(n for n in mapped if n.startswith("libpython") or ".cpython-" in n) == []


def test_the_runner_refuses_a_custom_op_its_process_does_not_have(stock_lowered, tmp_path):
    low = stock_lowered("proxy:_upsampler", _upsampler)
    path = tmp_path / "custom.pte"
    path.write_bytes(low.pte)
    with pytest.raises(runner.NativeRunError) as refused:
        runner.run_runner(path, list(low.inputs), trust_native_code=True)
    message = refused.value.stderr
    assert "extern-node table is refused" in message
    assert "etmtest_native::shift_scale is not registered" in message
