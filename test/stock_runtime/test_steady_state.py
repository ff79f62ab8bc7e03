"""10,000 executes of a small host program through the stock runtime: resident memory stays
flat, the native layer's live records and storages stay at their steady values, and no
shim call reaches Python (this library has no Python forwarder bound); the execute is
reported to the event tracer, which the Inspector reads back."""

from __future__ import annotations

import ctypes
import gc

import pytest
import torch
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock

RUNS = 10_000


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + x


@pytest.fixture(scope="module")
def small(stock_lowered):
    torch.manual_seed(5)
    return stock_lowered("steady:small", lambda: (Small(), (torch.randn(4, 16),)))


def test_10000_executes_leave_rss_and_native_storages_flat(small, trusted):
    method = Runtime.get().load_program(small.pte).load_method("forward")
    x = small.inputs[0]
    with torch.no_grad():
        expected = small.module(x)
    for _ in range(500):  # warm up: allocator caches, the record ring's pages
        method.execute([x])
    steady = stock.native_counts()
    rss = _rss_bytes()
    for i in range(RUNS):
        [got] = method.execute([x])
        if i % 1000 == 0:
            assert stock.native_counts() == steady
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert stock.native_counts() == steady
    assert steady["stores"] == 0  # every intermediate buffer went back
    assert steady["python_calls"] == 0  # no shim reached (unbound) Python
    grown = _rss_bytes() - rss
    assert grown < 512 << 10, f"resident memory grew by {grown} bytes over {RUNS} executes"
    assert not hasattr(ctypes.CDLL(None), "aoti_torch_empty_strided")  # nothing global
    del method
    gc.collect()
    assert stock.native_counts()["delegates"] == 0


def test_execute_is_an_event_of_the_etdump(small, trusted, tmp_path):
    from executorch.devtools import Inspector

    program = Runtime.get().load_program(small.pte, enable_etdump=True, debug_buffer_size=0)
    method = program.load_method("forward")
    for _ in range(3):
        method.execute(list(small.inputs))
    etdump = tmp_path / "run.etdp"
    program.write_etdump_result_to_file(str(etdump), str(tmp_path / "debug.bin"))
    inspector = Inspector(etdump_path=str(etdump))
    names = [e.name for block in inspector.event_blocks for e in block.events]
    assert "MetalBackend.execute" in names, names
    [event] = [
        e for b in inspector.event_blocks for e in b.events if e.name == "MetalBackend.execute"
    ]
    assert len(event.perf_data.raw) == 3  # one per execute
