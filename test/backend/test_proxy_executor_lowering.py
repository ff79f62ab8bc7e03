"""Operators without a C shim (an antialiased bilinear upsample, a custom op registered
here with torch.library) lowered for etmetal's runtime go into the delegate and run
through the proxy executor, on the host and on the emulated Metal device, matching
eager; lowered for upstream's runtime they stay out."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge
from executorch.exir._serialize._program import deserialize_pte_binary

from etmetal.backend.lowering import lower
from etmetal.backend.metal_partitioner import MetalPartitioner
from etmetal.common.delegate_blobs import EXTERN_NODES_SUFFIX
from etmetal.runtime import Runtime
from etmetal.shims import default_context, proxy_native
from etmetal.testing.pte_blobs import metal_delegates


@torch.library.custom_op("etmtest_lower::shifted_scale", mutates_args=())
def shifted_scale(x: torch.Tensor, w: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    return x * alpha + w.view(1, -1, 1, 1) + k


@shifted_scale.register_fake
def _(x, w, k, alpha):
    return torch.empty_like(x)


class Upsampler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear", antialias=True)
        z = torch.ops.etmtest_lower.shifted_scale(y.relu(), self.w, 3, 0.5)
        return z * 2 + 1


def _extern_keys(pte: bytes) -> list[str]:
    parsed = deserialize_pte_binary(pte)
    return [k for k in parsed.named_data.pte_data if k.endswith(EXTERN_NODES_SUFFIX)]


def _proxy_calls() -> int:
    """Calls the proxy executor served: the Python one's (the reference, and ``mps``
    devices) plus the native one's (host models on the native implementation)."""
    python = sum(e.calls for e in default_context().proxy_executors.values())
    return python + proxy_native.calls()


def _load_and_run(pte: bytes, x: torch.Tensor):
    """Load ``forward``, run it once on ``x``: (method, output, proxy-executor calls made)."""
    method = Runtime.get().load_program(pte, trust_native_code=True).load_method("forward")
    before = _proxy_calls()
    [got] = method.execute([x])
    return method, got, _proxy_calls() - before


@pytest.mark.parametrize("target", ["host", "mps_emulated"])
def test_ops_without_c_shim_run_delegated_through_the_proxy_executor(target):
    module, x = Upsampler().eval(), torch.randn(1, 3, 5, 6)
    program, partitioner = lower(module, (x,), target=target, runtime="etmetal")
    report = partitioner.report
    assert report.kept_out == []
    delegated = {op for p in report.partitions for op in p.ops}
    assert {"aten._upsample_bilinear2d_aa.vec", "etmtest_lower.shifted_scale.default"} <= delegated
    [table] = _extern_keys(program.buffer)  # the table travels in the named data
    [delegate] = metal_delegates(program.buffer)
    assert delegate.extern_nodes_key == table  # on the processed bytes' third line
    method, got, calls = _load_and_run(program.buffer, x)
    assert calls == 2  # both the upsample and the custom op went through the proxy executor
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)
    x2 = torch.randn(1, 3, 5, 6)  # a second run with other data
    [got2] = method.execute([x2])
    with torch.no_grad():
        torch.testing.assert_close(got2, module(x2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("target", ["host", "mps_emulated"])
def test_upstream_runtime_keeps_ops_without_c_shim_out(target):
    module, x = Upsampler().eval(), torch.randn(1, 3, 5, 6)
    with torch.no_grad():
        edge = to_edge(torch.export.export(module, (x,)))
    partitioner = MetalPartitioner(target=target, runtime="upstream")
    partitioner.partition(edge.exported_program())
    kept = {k.op: k.reason for k in partitioner.report.kept_out}
    assert "etmtest_lower.shifted_scale.default" in kept
    assert "proxy executor" in kept["etmtest_lower.shifted_scale.default"]
    assert any("upsample" in op for op in kept)


def test_default_runtime_is_etmetal_for_host_and_upstream_for_metal_targets():
    assert MetalPartitioner(target="host").runtime == "etmetal"
    assert MetalPartitioner(target="mps_emulated").runtime == "upstream"
    # the runtime spec is written only when it differs from the target's default
    specs = {s.key: s.value for s in MetalPartitioner(target="host").compile_specs}
    assert "runtime" not in specs
    specs = {
        s.key: s.value
        for s in MetalPartitioner(target="mps_emulated", runtime="etmetal").compile_specs
    }
    assert specs["runtime"] == b"etmetal"
    with pytest.raises(ValueError, match="unknown Metal runtime"):
        MetalPartitioner(target="host", runtime="libtorch")


def test_preprocess_accepts_proxy_calls_only_for_etmetals_runtime():
    from etmetal.backend.metal_backend import unsupported_externs
    from etmetal.backend.targets import resolve_runtime

    so = b"\x7fELF...aoti_torch_proxy_executor_call_function...aoti_torch_cpu_mm_out..."
    assert unsupported_externs(so, "host", "etmetal") == []
    [missing] = unsupported_externs(so, "host", "upstream")
    assert "proxy executor" in missing and "runtime='etmetal'" in missing
    assert unsupported_externs(so.replace(b"cpu_mm_out", b"cpu_cummax"), "host", "etmetal") == [
        "aoti_torch_cpu_cummax"
    ]
    with pytest.raises(ValueError, match="ExecuTorch's Metal runtime"):
        resolve_runtime("etmetal", "mps")


class LinearThenCustom(torch.nn.Module):
    """A weight AOTI stores (the linear's) and an op only the proxy executor runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.w = torch.nn.Parameter(torch.randn(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.etmtest_lower.shifted_scale(self.lin(x), self.w, 3, 0.5)


@pytest.mark.parametrize("share", [None, b"0"])
def test_shared_weights_and_the_extern_node_table_together(share):
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    torch.manual_seed(5)
    module, x = LinearThenCustom().eval(), torch.randn(1, 2, 3, 8)
    specs = None if share is None else [CompileSpec("share_weights", share)]
    program, _ = lower(module, (x,), target="host", compile_specs=specs)
    [delegate] = metal_delegates(program.buffer)
    # host default: the constants one by one (index on line 2) and the table on line 3;
    # the opt-out: upstream's one blob on line 2, the table still on line 3
    assert delegate.layout == ("shared" if share is None else "one_blob")
    assert delegate.extern_nodes_key == _extern_keys(program.buffer)[0]
    weight = module.lin.weight.detach().numpy().tobytes()
    if share is None:
        [key] = [c["key"] for c in delegate.index if c["fqn"] == "lin.weight"]
        assert delegate.constants[key][: len(weight)] == weight
    else:
        assert weight in delegate.weights
    _, got, calls = _load_and_run(program.buffer, x)
    assert calls == 1
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)
