"""Every upsample variant lowered whole: the fallbacks and proxy-executor calls the
partitioner predicts are exactly what the generated wrapper ``.cpp`` calls, and the
delegate computes what eager does.

Inductor generates plain bilinear, bicubic and nearest upsampling (AOTAutograd traces
their Python decompositions) and runs the antialiased ones, which have no C shim, through
the proxy executor; a wrong prediction either keeps a delegatable op out or lets a ``.so``
call something its runtime lacks.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from etmetal.backend import metal_backend
from etmetal.backend.lowering import lower
from etmetal.backend.mps_abi import fallback_calls_in_source
from etmetal.common.fallback_table import PROXY_EXECUTOR_SHIM
from etmetal.runtime import Runtime
from etmetal.shims import default_context, proxy_native

aten = torch.ops.aten

# name -> (the upsample, the ATen op the partitioner sees for it)
VARIANTS = {
    "bilinear_size": (
        lambda x: F.interpolate(x, size=(11, 13), mode="bilinear"),
        "aten.upsample_bilinear2d.vec",
    ),
    "bilinear_scale_align_corners": (
        lambda x: F.interpolate(x, scale_factor=(2.0, 1.5), mode="bilinear", align_corners=True),
        "aten.upsample_bilinear2d.vec",
    ),
    "bilinear_downscale": (
        lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", align_corners=False),
        "aten.upsample_bilinear2d.vec",
    ),
    # to_edge decomposes this overload itself (into index arithmetic) before partitioning
    "bilinear_default_overload": (
        lambda x: aten.upsample_bilinear2d.default(x, [12, 16], False),
        None,
    ),
    "bilinear_antialias": (
        lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
        "aten._upsample_bilinear2d_aa.vec",
    ),
    "bicubic": (
        lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False),
        "aten.upsample_bicubic2d.vec",
    ),
    "bicubic_antialias": (
        lambda x: F.interpolate(x, size=(4, 5), mode="bicubic", antialias=True),
        "aten._upsample_bicubic2d_aa.vec",
    ),
    "nearest": (
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
        "aten.upsample_nearest2d.vec",
    ),
    "nearest_exact": (
        lambda x: F.interpolate(x, size=(9, 10), mode="nearest-exact"),
        "aten._upsample_nearest_exact2d.vec",
    ),
}
# the emulated Metal device predicts on the mps decompositions: the bilinear forms there too
EMULATED = ("bilinear_size", "bilinear_scale_align_corners", "bilinear_antialias")


class Upsample(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.upsample = VARIANTS[name][0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.upsample(x) * 2.0 + 1.0


def _table_targets(table: bytes | None) -> set[str]:
    """The operators of an extern-node table, spelled as the partitioner names them."""
    if table is None:
        return set()
    out = set()
    for entry in json.loads(table)["nodes"]:
        namespace, _, name = entry["node"]["target"].partition("::")  # "aten::op[.overload]"
        overload = name if "." in name else f"{name}.default"
        out.add(f"proxy executor: {namespace}.{overload}")
    return out


def _wrapper_calls(artifact) -> set[str]:
    """The fallback shims the wrapper source calls, and the operator behind each of its
    proxy-executor calls (from the extern-node table the calls index)."""
    assert artifact.wrapper_cpp_path is not None, "the compile kept no wrapper .cpp"
    source = artifact.wrapper_cpp_path.read_text()
    called = fallback_calls_in_source(source)
    targets = _table_targets(artifact.extern_nodes_bytes())
    # the wrapper calls the proxy executor exactly when there is a table for it to index
    assert (f"{PROXY_EXECUTOR_SHIM}(" in source) == bool(targets)
    return called | targets


def _proxy_calls() -> int:
    """Calls either proxy executor served: the Python one's and (host models on the
    native implementation) the native one's."""
    python = sum(e.calls for e in default_context().proxy_executors.values())
    return python + proxy_native.calls()


@pytest.mark.parametrize(
    ("name", "target"),
    [(n, "host") for n in VARIANTS] + [(n, "mps_emulated") for n in EMULATED],
)
def test_predicted_calls_are_what_the_wrapper_calls(name, target, monkeypatch):
    artifacts = []
    compile_partition = metal_backend.compile_exported_program

    def recording(*args, **kwargs):
        artifact = compile_partition(*args, **kwargs)
        artifacts.append(artifact)
        return artifact

    monkeypatch.setattr(metal_backend, "compile_exported_program", recording)
    module, x = Upsample(name).eval(), torch.randn(2, 3, 6, 8)
    program, partitioner = lower(module, (x,), target=target, runtime="etmetal")
    report = partitioner.report
    assert report.kept_out == [], report.text()
    [partition] = report.partitions
    upsample = VARIANTS[name][1]
    if upsample is not None:  # kept whole for Inductor, not decomposed for the portable runtime
        assert upsample in partition.ops
    else:
        assert not any("upsample" in op for op in partition.ops)
    [artifact] = artifacts
    predicted = set(partition.fallbacks)
    called = _wrapper_calls(artifact)
    assert predicted == called, f"{name}: predicted {sorted(predicted)}, called {sorted(called)}"

    method = Runtime.get().load_program(program.buffer, trust_native_code=True)
    method = method.load_method("forward")
    before = _proxy_calls()
    [got] = method.execute([x])
    proxied = sum(1 for k in partition.fallbacks if k.startswith("proxy executor: "))
    assert _proxy_calls() - before == proxied
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)
