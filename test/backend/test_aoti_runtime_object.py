"""torch's AOTI runtime interface compiled once and linked into every wrapper's ``.so``: the
split build holds the same dynamic symbols and computes what the whole build and eager do,
one runtime object serves every model built with the same flags, and a runtime object that
cannot be built leaves the wrapper whole."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from etmetal.backend import aoti_runtime_object, mps_emulated_compile
from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.examples.metal_registry import get_model_and_inputs
from etmetal.shims import AotiModel

pytestmark = pytest.mark.skipif(
    mps_emulated_compile.compiler() is None or shutil.which("nm") is None,
    reason="needs a C++ compiler and nm",
)

INCLUDES = "\n#include <torch/csrc/inductor/aoti_include/cpu.h>\n"


def _export(name: str):
    module, inputs = get_model_and_inputs(name)
    with torch.no_grad():
        return module, inputs, torch.export.export(module, inputs)


def _dynamic_symbols(so) -> tuple[set[str], set[str]]:
    """The C ABI a ``.so`` exports (``AOTInductor*``: what a runner calls) and every symbol
    it needs, as the dynamic loader sees them. (C++ template instantiations the ``.so``
    also exports differ: the split instantiates all of the model base class.)"""

    def names(*flags: str) -> set[str]:
        out = subprocess.run(["nm", "-D", *flags, str(so)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}

    exported = {n for n in names("--defined-only") if n.startswith("AOTInductor")}
    return exported, names("--undefined-only")


def _run(artifact, inputs, device: str) -> list[torch.Tensor]:
    with AotiModel(
        artifact.so_path, artifact.weights_bytes(), device=device, shims="native"
    ) as model:
        return [t.clone() for t in model.run(list(inputs))]


def test_the_split_moves_only_torchs_interface_text():
    interface = aoti_runtime_object.interface_text()
    model_code = "namespace torch::aot_inductor { int model_code; }\n"
    parts = aoti_runtime_object.split(INCLUDES + interface + model_code)
    assert parts is not None
    assert interface not in parts.model_source and parts.model_source.endswith(model_code)
    assert parts.model_source.startswith(INCLUDES) and "extern template class" in parts.model_source
    assert parts.runtime_source.startswith(INCLUDES + interface)
    assert model_code not in parts.runtime_source
    # anything but includes before the interface, or the interface twice: compiled whole
    assert aoti_runtime_object.split("int x;\n" + interface + model_code) is None
    assert aoti_runtime_object.split(INCLUDES + interface + interface) is None
    assert aoti_runtime_object.split(INCLUDES + interface[:-200] + model_code) is None


def _source_files(so) -> set[str]:
    """The translation units a ``.so`` was linked from (its symbol table's FILE entries)."""
    out = subprocess.run(["readelf", "-sW", str(so)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {line.split()[-1] for line in out.stdout.splitlines() if " FILE " in line}


@pytest.mark.parametrize(("target", "device"), [("host", "cpu"), ("mps_emulated", "mps")])
def test_split_and_whole_builds_hold_the_same_symbols_and_compute_the_same(
    target, device, monkeypatch
):
    module, inputs, ep = _export("mm_weight_param")
    split = compile_exported_program(ep, target=target)  # the suite's shared build
    monkeypatch.setenv(aoti_runtime_object.ENV, "0")
    whole = compile_exported_program(ep, target=target, use_cache=False)
    try:
        assert split.key != whole.key  # the recipe is part of the key
        # the split .so was linked with the runtime object, the whole one without it
        assert "aoti_runtime.cpp" in _source_files(split.so_path)
        assert "aoti_runtime.cpp" not in _source_files(whole.so_path)
        assert _dynamic_symbols(split.so_path) == _dynamic_symbols(whole.so_path)
        got, reference = _run(split, inputs, device), _run(whole, inputs, device)
    finally:
        shutil.rmtree(whole.so_path.parent)
    with torch.no_grad():
        expected = module(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    for a, b, e in zip(got, reference, expected, strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def test_one_runtime_object_serves_every_host_model(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("ETMETAL_CACHE_DIR", str(root))
    for name in ("mm_weight_param", "linear_bias"):
        module, inputs, ep = _export(name)
        artifact = compile_exported_program(ep, target="host")
        [got] = _run(artifact, inputs, "cpu")
        with torch.no_grad():
            torch.testing.assert_close(got, module(*inputs), atol=1e-4, rtol=1e-4)
    entries = [p for p in (root / aoti_runtime_object.KIND).iterdir() if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / aoti_runtime_object.OBJECT).is_file()


def test_a_runtime_object_that_does_not_build_leaves_the_wrapper_whole(
    mps_emulated_artifact, tmp_path, monkeypatch, caplog
):
    _, artifact = mps_emulated_artifact("mm_weight_param")
    wrapper, linked = artifact.wrapper_cpp_path, []
    link = mps_emulated_compile._link_wrapper

    def spy(cxx, flags, pch, cpp, objects, so):
        linked.append((cpp, objects))
        return link(cxx, flags, pch, cpp, objects, so)

    def broken(cmd):
        raise RuntimeError("g++ exit 1: planted failure")

    monkeypatch.setattr(mps_emulated_compile, "_link_wrapper", spy)
    defines = ["USE_MPS", "TORCH_INDUCTOR_CPP_WRAPPER"]
    split, whole = tmp_path / "split" / "model.so", tmp_path / "whole" / "model.so"
    split.parent.mkdir()
    whole.parent.mkdir()
    mps_emulated_compile.compile_wrapper(wrapper, [], defines, split)
    # a cache without the runtime object, whose build fails
    monkeypatch.setattr(aoti_runtime_object, "compile_object", broken)
    (tmp_path / "cache").mkdir(mode=0o700)
    monkeypatch.setenv("ETMETAL_CACHE_DIR", str(tmp_path / "cache"))
    mps_emulated_compile.compile_wrapper(wrapper, [], defines, whole)
    [(model_part, [runtime]), (cpp, objects)] = linked
    assert model_part.name.endswith(".model.cpp") and runtime.name == aoti_runtime_object.OBJECT
    assert cpp == wrapper and objects == []
    assert "compiling" in caplog.text and "planted failure" in caplog.text
    assert _dynamic_symbols(split) == _dynamic_symbols(whole)
    # nothing is left beside the .so, nor written into the cached wrapper's entry
    assert sorted(p.name for p in split.parent.iterdir()) == ["model.so"]
    assert not any(p.name.endswith(".model.cpp") for p in wrapper.parent.iterdir())
