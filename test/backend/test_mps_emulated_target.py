"""The ``mps_emulated`` target without building anything: target resolution and its
errors, the compile-scoped patches (active inside, undone after, also on failure), the
undefined-symbol check and the Metal runtime ABI list."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch import nn

from etmetal.backend import aoti_compile, mps_emulated_compile, targets
from etmetal.backend.compile_specs import parse_compile_specs
from etmetal.backend.metal_partitioner import MetalPartitioner
from etmetal.backend.mps_abi import MPS_RUNTIME_ABI, fallback_calls, fallback_calls_in_source
from etmetal.backend.mps_decompositions import views_as_reshapes
from etmetal.backend.mps_emulation import RealConstants, emulated_mps_codegen, fake_mps_module
from etmetal.backend.supported_ops import SUPPORTED_FALLBACKS

TORCH_INCLUDE = Path(torch.__file__).parent / "include"


# -- target resolution -----------------------------------------------------------
def test_mps_emulated_is_a_target_on_the_mps_device():
    partitioner = MetalPartitioner(target="mps_emulated")
    assert partitioner.target == "mps_emulated"
    record = targets.get_target("mps_emulated")
    assert partitioner.target_record is record
    assert (record.torch_device, record.container_device, record.shim_prefix) == ("mps",) * 3
    assert partitioner.capabilities.device == "mps"
    # the point of the target: its predictions are the real Metal ones
    assert partitioner.capabilities.supported_fallbacks == SUPPORTED_FALLBACKS["mps"]
    spec = {s.key: s.value for s in partitioner.delegation_spec.compile_specs}
    assert spec["target"] == b"mps_emulated"


def test_compile_spec_selects_mps_emulated():
    options = parse_compile_specs([CompileSpec("target", b"mps_emulated")])
    assert options.target is targets.MPS_EMULATED and options.target.name == "mps_emulated"
    assert MetalPartitioner([CompileSpec("target", b"mps_emulated")]).target == "mps_emulated"


@pytest.mark.parametrize("mps", [False, True])
def test_auto_never_picks_mps_emulated(monkeypatch, mps):
    monkeypatch.setattr(targets, "mps_available", lambda: mps)
    assert targets.resolve_target("auto").name == ("mps" if mps else "host")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the non-macOS error")
def test_mps_on_this_host_fails_naming_mps_emulated():
    with pytest.raises(RuntimeError, match="target='mps_emulated'"):
        MetalPartitioner(target="mps")
    with pytest.raises(RuntimeError, match="mps_emulated"):
        aoti_compile.compile_exported_program(None, target="mps")  # type: ignore[arg-type]


@pytest.mark.parametrize("target", ["mps-emulated", "emulated", "MPS_EMULATED"])
def test_misspelled_targets_list_mps_emulated(target):
    with pytest.raises(ValueError, match=r"'mps_emulated'"):
        MetalPartitioner(target=target)


def test_compile_rejects_unknown_targets_and_libtorch():
    with pytest.raises(ValueError, match="unknown Metal target 'metal'.*'mps_emulated'"):
        aoti_compile.compile_exported_program(None, target="metal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without libtorch"):
        aoti_compile.compile_exported_program(
            None,  # type: ignore[arg-type]
            target="mps_emulated",
            link_libtorch=True,
        )


# -- the fake device -------------------------------------------------------------
class TwoTwins(nn.Module):
    """Two parameters of one shape, a buffer and a small constant Inductor inlines."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(3, 5))
        self.b = nn.Parameter(torch.randn(3, 5))
        self.register_buffer("c", torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b + self.c


def test_fake_mps_module_leaves_the_program_alone():
    module = TwoTwins().eval()
    ep = torch.export.export(module, (torch.randn(3, 5),))
    gm, inputs, reals = fake_mps_module(ep)
    assert [t.device.type for t in inputs] == ["mps"]
    assert {p.device.type for p in gm.parameters()} | {b.device.type for b in gm.buffers()} == {
        "mps"
    }
    assert len(reals) == 3
    # the exported program keeps its real CPU tensors and values
    assert all(v.device.type == "cpu" for v in ep.state_dict.values())
    assert torch.equal(ep.state_dict["a"], module.a.detach())
    # each fake resolves to its own real values, also through views and Parameter wrappers
    assert torch.equal(reals.real_of(gm.a), module.a.detach())
    assert torch.equal(reals.real_of(gm.b), module.b.detach())
    with gm.a.fake_mode:
        view = torch.ops.aten.slice.Tensor(gm.a, 0, 1)
    assert torch.equal(reals.real_of(view), module.a.detach()[1:])


def test_real_constants_copy_offset_views_into_their_own_storage():
    base = torch.arange(20.0)
    view = base[4:16].view(3, 4)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = torch.empty_strided((3, 4), (4, 1), device="mps")
    del mode
    reals = RealConstants()
    reals.add("v", fake, view)
    assert torch.equal(reals.real_of(fake), view)
    assert reals.real_of(torch.zeros(2)) is None


def _patched_state():
    import torch._inductor.codegen.cpp_wrapper_gpu as cpp_wrapper_gpu
    import torch._inductor.fx_passes.freezing_patterns as freezing_patterns
    import torch._inductor.fx_passes.joint_graph as joint_graph
    import torch._inductor.graph as inductor_graph
    from torch._inductor.codecache import AotCodeCompiler
    from torch._inductor.graph import GraphLowering
    from torch._subclasses.fake_tensor import FakeTensor

    return {
        "joint_graph.lazy_init": joint_graph.lazy_init,
        "freezing_patterns.lazy_init": freezing_patterns.lazy_init,
        "get_gpu_type": cpp_wrapper_gpu.get_gpu_type,
        "torch_function_modes": torch.overrides._get_current_function_mode_stack(),
        "is_same_tensor": inductor_graph.is_same_tensor,
        "get_original_value_of_constant": GraphLowering.__dict__["get_original_value_of_constant"],
        "AotCodeCompiler.compile": AotCodeCompiler.__dict__["compile"],
        "FakeTensor.tolist": FakeTensor.__dict__.get("tolist"),
        "FakeTensor.item": FakeTensor.__dict__.get("item"),
        "UniformValueConstantFolder.run_node": joint_graph.UniformValueConstantFolder.__dict__.get(
            "run_node"
        ),
        "_mps_get_core_count": getattr(torch._C, "_mps_get_core_count", None),
        "_mps_get_name": getattr(torch._C, "_mps_get_name", None),
    }


def test_patches_are_active_inside_the_compile_only():
    import torch._inductor.codegen.cpp_wrapper_gpu as cpp_wrapper_gpu

    before = _patched_state()
    with emulated_mps_codegen(RealConstants()):
        inside = _patched_state()
        assert cpp_wrapper_gpu.get_gpu_type() == "mps"
        assert torch._C._mps_get_core_count() > 0
        assert isinstance(torch._C._mps_get_name(), str)
    changed = {k for k in before if before[k] is not inside[k]}
    assert changed == set(before), f"not patched: {set(before) - changed}"
    assert _patched_state() == before


def test_patches_are_undone_when_the_compile_fails(monkeypatch):
    before = _patched_state()
    seen = {}

    def failing_aot_compile(*args, **kwargs):
        import torch._inductor.codegen.cpp_wrapper_gpu as cpp_wrapper_gpu

        seen["gpu"] = cpp_wrapper_gpu.get_gpu_type()
        raise RuntimeError("inductor failed here")

    monkeypatch.setattr(torch._inductor, "aot_compile", failing_aot_compile)
    ep = torch.export.export(TwoTwins().eval(), (torch.randn(3, 5),))
    with pytest.raises(RuntimeError, match="inductor failed here"):
        aoti_compile.compile_exported_program(ep, target="mps_emulated", use_cache=False)
    assert seen == {"gpu": "mps"}
    assert _patched_state() == before


# -- undefined symbols and the Metal ABI -------------------------------------------
def test_runtime_abi_is_what_shim_mps_h_declares():
    header = (TORCH_INCLUDE / "torch/csrc/inductor/aoti_torch/c/shim_mps.h").read_text()
    declared = set(re.findall(r"\b(aoti_torch_mps_[a-z_0-9]+)\s*\(", header))
    assert declared == MPS_RUNTIME_ABI


def test_fallbacks_exclude_the_runtime_abi():
    names = ["aoti_torch_mps_mm_out", "aoti_torch_mps_malloc", "aoti_torch_get_sizes"]
    assert fallback_calls(names) == {"aoti_torch_mps_mm_out"}
    source = "x(aoti_torch_mps_start_encoding(h)); aoti_torch_mps_bmm_out(a, b, c);"
    assert fallback_calls_in_source(source) == {"aoti_torch_mps_bmm_out"}


def test_unexpected_symbols_are_those_no_shim_or_system_library_serves():
    symbols = [
        ("aoti_torch_mps_malloc", ""),
        ("memcpy", "GLIBC_2.14"),
        ("_ZNSt6localeC1Ev", "GLIBCXX_3.4"),
        ("_Unwind_Resume", "GCC_3.0"),
        ("_ZN3c105ErrorC2ENS_14SourceLocationE", ""),
        ("cudaMalloc", ""),
    ]
    assert mps_emulated_compile.unexpected_symbols(symbols) == [
        "_ZN3c105ErrorC2ENS_14SourceLocationE",
        "cudaMalloc",
    ]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")
def test_a_so_needing_libtorch_fails_the_check_by_name(tmp_path):
    source = Path(__file__).parent / "native" / "needs_c10.c"
    so = tmp_path / "needs_c10.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(source), "-o", str(so)], check=True)
    with pytest.raises(mps_emulated_compile.MpsEmulatedBuildError, match="c10_error_handler"):
        mps_emulated_compile.check_undefined_symbols(so)


def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(mps_emulated_compile, "compiler", lambda: None)
    with pytest.raises(
        mps_emulated_compile.MpsEmulatedBuildError, match="needs a C\\+\\+ compiler"
    ):
        mps_emulated_compile.compile_wrapper(tmp_path / "w.cpp", [], ["USE_MPS"], tmp_path / "m.so")


def test_compiler_errors_are_reported_with_the_wrapper(tmp_path):
    if mps_emulated_compile.compiler() is None:
        pytest.skip("needs a C++ compiler")
    cpp = tmp_path / "broken.wrapper.cpp"
    cpp.write_text("int f() { return undeclared_name; }\n")
    with pytest.raises(mps_emulated_compile.MpsEmulatedBuildError, match="undeclared_name"):
        mps_emulated_compile.compile_wrapper(cpp, [], ["USE_MPS"], tmp_path / "m.so")


class _TransposeReshape(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1) * 2


def test_views_fitted_to_one_layout_become_reshapes_for_another():
    # exported with the layout CPU flash attention returns: export records a view that
    # a contiguous producer (the mps math attention's output) cannot take
    cpu_layout = torch.randn(2, 16, 4, 8).transpose(1, 2)
    gm = torch.export.export(_TransposeReshape(), (cpu_layout,)).run_decompositions({}).module()
    contiguous = torch.randn(2, 4, 16, 8)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        gm(contiguous)
    assert views_as_reshapes(gm) == 1
    targets_left = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.view.default not in targets_left
    for x in (contiguous, cpu_layout):
        torch.testing.assert_close(gm(x), _TransposeReshape()(x))
