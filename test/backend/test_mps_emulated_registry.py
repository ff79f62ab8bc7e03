"""ExecuTorch's Metal test registry lowered with ``mps_emulated``: every module lowers
whole, the partitioner's predicted fallbacks are the fallbacks the generated Metal
wrapper calls, the ``.so`` needs only the AOTI shims and the system libraries, and the
weights blob holds the module's real parameters."""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary

from etmetal.backend.mps_abi import fallback_calls, fallback_calls_in_source
from etmetal.backend.mps_emulated_compile import undefined_symbols
from etmetal.examples.metal_registry import REGISTRY

SYSTEM_VERSION = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC)_")


def delegates(pte: bytes) -> list[dict]:
    """Each Metal delegate of the forward plan: compile specs, .so bytes, weights bytes."""
    parsed = deserialize_pte_binary(pte)
    program, named = parsed.program, parsed.named_data
    out = []
    for d in program.execution_plan[0].delegates:
        so_key, weights_key = program.backend_delegate_data[d.processed.index].data.decode().split()
        so, weights = (named.buffers[named.pte_data[k].buffer_index] for k in (so_key, weights_key))
        assert so_key.startswith(hashlib.sha256(so).hexdigest())
        specs = {s.key: s.value for s in d.compile_specs}
        out.append({"specs": specs, "so": so, "weights": weights})
    return out


def so_symbols(so: bytes) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="etmetal-test-") as tmp:
        path = Path(tmp) / "model.so"
        path.write_bytes(so)
        return undefined_symbols(path)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_predicted_fallbacks_are_the_ones_the_metal_wrapper_calls(name, mps_emulated_program):
    lowered = mps_emulated_program(name)
    [report] = lowered.partitioner.reports
    assert report.kept_out == [], f"{name}: kept out {report.kept_out}"
    predicted = {k for p in report.partitions for k in p.fallbacks}
    called: set[str] = set()
    found = delegates(lowered.pte)
    assert len(found) == len(report.partitions) >= 1
    for delegate in found:
        assert delegate["specs"]["target"] == b"mps_emulated"
        called |= fallback_calls(n for n, _ in so_symbols(delegate["so"]))
    assert predicted == called, f"{name}: predicted {sorted(predicted)}, called {sorted(called)}"


@pytest.mark.parametrize("name", ["add", "mm_weight_param"])
def test_the_so_needs_only_aoti_shims_and_system_libraries(name, mps_emulated_program):
    [delegate] = delegates(mps_emulated_program(name).pte)
    symbols = so_symbols(delegate["so"])
    names = {n for n, _ in symbols}
    foreign = [
        f"{n}@{v}"
        for n, v in symbols
        if not n.startswith("aoti_torch_") and not SYSTEM_VERSION.match(v)
    ]
    assert foreign == []
    # the Metal runtime ABI, not the CPU one: constants go to an mps buffer
    assert {"aoti_torch_mps_malloc", "aoti_torch_mps_memcpy"} <= names or name == "add"
    if name == "add":  # a generated kernel: shader library, kernel function, command block
        assert {
            "aoti_torch_mps_create_shader_library",
            "aoti_torch_mps_get_kernel_function",
            "aoti_torch_mps_run_command_block",
            "aoti_torch_mps_start_encoding",
            "aoti_torch_mps_set_arg_tensor",
        } <= names
    assert not any(n.startswith("aoti_torch_cpu_") for n in names)


def test_wrapper_source_calls_what_the_so_imports(mps_emulated_artifact):
    _, artifact = mps_emulated_artifact("mm_weight_param")
    source = artifact.wrapper_cpp_path.read_text()
    imported = fallback_calls(n for n, _ in undefined_symbols(artifact.so_path))
    assert fallback_calls_in_source(source) == imported == {"aoti_torch_mps_mm_out"}
    # the wrapper a Mac gets: Metal kernel loading, constants on the mps device
    assert "#include <ATen/native/mps/MetalShaderLibrary.h>" in source
    assert "cached_torch_device_type_mps" in source
    assert "cached_torch_device_type_cpu;" not in source.split("constants_info_")[-1]


def _chunks(blob: bytes, sizes: list[int]) -> list[bytes]:
    out, offset = [], 0
    for size in sizes:
        out.append(blob[offset : offset + size])
        offset += (size + 63) // 64 * 64  # Inductor pads each constant to 64 bytes
    assert offset == len(blob)
    return out


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


def test_weights_blob_holds_the_real_parameter(mps_emulated_artifact):
    module, artifact = mps_emulated_artifact("mm_weight_param")
    weight = _bytes(module.weight)
    assert _chunks(artifact.weights_bytes(), [len(weight)]) == [weight]


def test_parameters_of_one_shape_stay_distinct_constants(mps_emulated_program):
    # q, k and v have the same shape: fake tensors would all look like one storage
    lowered = mps_emulated_program("sdpa_add")
    [delegate] = delegates(lowered.pte)
    params = [_bytes(p) for p in (lowered.module.q, lowered.module.k, lowered.module.v)]
    chunks = _chunks(delegate["weights"], [len(p) for p in params])
    assert sorted(chunks) == sorted(params)
