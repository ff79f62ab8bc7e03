"""The delegate against independent references: torch's own AOTI runner on the same
partition compiled with libtorch (bitwise), and flat memory over 1,000 executes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

import etmetal.backend.metal_backend as metal_backend
from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.backend.metal_partitioner import MetalPartitioner
from etmetal.examples import strided_views
from etmetal.examples.metal_registry import get_model_and_inputs
from etmetal.layout.config import backend_config
from etmetal.runtime import Runtime
from etmetal.shims import memory_stats
from etmetal.testing.resident import resident_bytes

_TORCH_RUNNER = """
import sys, torch
so, blob, io = sys.argv[1:]
runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
runner.update_constant_buffer_from_blob(blob)
torch.save([runner.run(xs) for xs in torch.load(io)], io)
"""


def run_on_torch_runner(so_path, weights_path, runs, tmp_path) -> list[list[torch.Tensor]]:
    """Outputs of torch's own AOTI runner, in a fresh process: once etmetal's trampoline is
    in the global scope (any delegate loaded), a libtorch ``.so`` loaded later binds its
    ``aoti_torch_*`` calls to etmetal instead of libtorch and aborts."""
    io = tmp_path / "runs.pt"
    torch.save(runs, io)
    proc = subprocess.run(
        [sys.executable, "-c", _TORCH_RUNNER, str(so_path), str(weights_path), str(io)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return torch.load(io)


def _make(name: str):
    if name in strided_views.CASES_BY_NAME:
        case = strided_views.CASES_BY_NAME[name]
        torch.manual_seed(0)
        return case.make_module().eval(), case.make_inputs()
    return get_model_and_inputs(name)


@pytest.mark.parametrize("name", ["sdpa_strided", "rope_split_halves", "channels_last_chunk_cat"])
def test_same_partition_on_torch_runner_is_bitwise_equal(name, monkeypatch, tmp_path):
    module, inputs = _make(name)
    partitions = []
    compile_for_delegate = metal_backend.compile_exported_program

    def capture(ep, **kwargs):
        partitions.append(ep)
        return compile_for_delegate(ep, **kwargs)

    monkeypatch.setattr(metal_backend, "compile_exported_program", capture)
    with torch.no_grad():
        ep = torch.export.export(module, inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[MetalPartitioner(target="host")])
    pte = edge.to_executorch(backend_config()).buffer
    assert len(partitions) == 1  # the whole model is one delegate
    # the exact program the delegate's .so was compiled from, now with libtorch
    reference = compile_exported_program(partitions[0], target="host", link_libtorch=True)
    runs = []
    for seed in (0, 1, 2):
        gen = torch.Generator().manual_seed(seed)
        xs = [torch.randn(x.shape, generator=gen) for x in inputs]
        # keep each example input's layout (the channels-last case)
        runs.append(
            [
                y.to(memory_format=torch.channels_last)
                if x.dim() == 4 and not x.is_contiguous()
                else y
                for x, y in zip(inputs, xs)
            ]
        )
    expected_runs = run_on_torch_runner(reference.so_path, reference.weights_path, runs, tmp_path)
    method = Runtime.get().load_program(pte, trust_native_code=True).load_method("forward")
    for xs, expected in zip(runs, expected_runs):
        got = method.execute(xs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype
            assert torch.equal(g, e), f"{name}: max diff {(g - e).abs().max().item()}"
    method.destroy()


@pytest.mark.rss_flat  # measures RSS: not under ASan (etmetal regress sanitize)
@pytest.mark.parametrize("name", ["linear_bias", "rope_split_halves"])
def test_thousand_executes_keep_memory_flat(name, lowered):
    low = lowered(
        f"registry:{name}" if name == "linear_bias" else f"strided:{name}", lambda: _make(name)
    )
    method = Runtime.get().load_program(low.pte, trust_native_code=True).load_method("forward")
    xs = list(low.inputs)
    for _ in range(100):  # warm-up: the shim buffer cache and torch's allocator settle
        method.execute(xs)
    baseline = memory_stats()
    rss0 = resident_bytes()
    for i in range(1000):
        method.execute(xs)
        stats = memory_stats()
        assert (stats.storages, stats.tensors, stats.bytes) == (
            baseline.storages,
            baseline.tensors,
            baseline.bytes,
        ), f"execute {i}: {stats} vs {baseline}"
    growth = resident_bytes() - rss0
    print(
        f"{name}: RSS growth over 1,000 executes: {growth} bytes; live storages {baseline.storages}"
    )
    assert growth < 1 << 20
    method.destroy()
    assert memory_stats().storages == 0
