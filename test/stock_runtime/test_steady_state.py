"""10,000 executes of a small host program through the stock runtime: resident memory stays
flat, the native layer's live records and storages stay at their steady values, and no
shim call reaches Python (this library has no Python forwarder bound); the execute and its
fallbacks are reported to the event tracer, which the Inspector reads back; and a process
without Python registers and configures the library."""

from __future__ import annotations

import ctypes
import gc
import subprocess

import pytest
import torch
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock
from etmetal.testing.resident import resident_bytes

RUNS = 10_000


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
    python_calls = stock.native_counts()["python_calls"]  # since load (other tests add)
    for _ in range(500):  # warm up: allocator caches, the record ring's pages
        method.execute([x])
    steady = stock.native_counts()
    rss = resident_bytes()
    for i in range(RUNS):
        [got] = method.execute([x])
        if i % 1000 == 0:
            assert stock.native_counts() == steady
    grown = resident_bytes() - rss  # before the checks below, which load code of their own
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert stock.native_counts() == steady
    assert steady["stores"] == 0  # every intermediate buffer went back
    assert steady["python_calls"] == python_calls  # no shim reached (unbound) Python
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


def test_the_demo_transformers_etdump_holds_its_execute_and_fallback_events(
    stock_lowered, trusted, tmp_path
):
    from executorch.devtools import Inspector

    from etmetal.examples.demo import get_demo

    low = stock_lowered("demo:transformer_block", lambda: get_demo("transformer_block"))
    [partition] = low.partitioner.report.partitions
    fallbacks = set(partition.fallbacks)  # what the partitioner says the .so calls
    assert fallbacks
    program = Runtime.get().load_program(low.pte, enable_etdump=True, debug_buffer_size=0)
    method = program.load_method("forward")
    [got] = method.execute(list(low.inputs))
    with torch.no_grad():
        torch.testing.assert_close(got, low.module(*low.inputs), atol=1e-4, rtol=1e-4)
    etdump = tmp_path / "demo.etdp"
    program.write_etdump_result_to_file(str(etdump), str(tmp_path / "debug.bin"))
    names = {e.name for b in Inspector(etdump_path=str(etdump)).event_blocks for e in b.events}
    assert "MetalBackend.execute" in names
    assert fallbacks <= names, sorted(names)


def test_a_process_without_python_registers_and_configures_the_library(tmp_path):
    """What a Python-free runner does first: load the library (libexecutorch comes with it),
    check the registration, configure it from C."""
    from etmetal.common.native_build import compiler
    from etmetal.shims.native_fallbacks import libtorch_cpu_path

    source = tmp_path / "probe.c"
    source.write_text(
        '#include <dlfcn.h>\n#include <stdio.h>\n#include <string.h>\n#include "etmetal_stock.h"\n'
        "int main(int argc, char** argv) {\n"
        "  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);\n"
        '  if (!lib) { printf("dlopen %s\\n", dlerror()); return 2; }\n'
        '  int (*reg)(void) = (int (*)(void))dlsym(lib, "etm_stock_registration");\n'
        '  int (*conf)(const char*) = (int (*)(const char*))dlsym(lib, "etm_stock_configure");\n'
        '  const char* (*err)(void) = (const char* (*)(void))dlsym(lib, "etm_stock_last_error");\n'
        '  printf("registration %d configure %d [%s]\\n", reg(), conf(argv[2]), err());\n'
        '  printf("bad %d [%s]\\n", conf("/nonexistent/libtorch_cpu.so"), err());\n'
        '  FILE* maps = fopen("/proc/self/maps", "r");\n  char line[4096];\n'
        '  while (fgets(line, sizeof line, maps)) if (strstr(line, "libpython")) printf("%s", line);\n'
        "  return 0;\n}\n"
    )
    exe = tmp_path / "probe"
    include = str(stock.header_path().parent)
    build = subprocess.run(
        [compiler("c"), "-O1", "-I", include, str(source), "-o", str(exe), "-ldl"],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    proc = subprocess.run(
        [str(exe), str(stock.library_path()), str(libtorch_cpu_path())],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "registration 0 configure 0 []", proc.stdout
    assert lines[1].startswith("bad 1 [etm_stock_configure: cannot load libtorch_cpu from ")
    assert len(lines) == 2, "libpython is mapped: " + "\n".join(lines[2:])
