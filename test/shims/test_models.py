"""Host AOTI ``.so``s (``link_libtorch=False``) run through the bridge, compared with eager."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.examples.strided_views import CASES, CASES_BY_NAME, exported
from etmetal.shims import (
    HOST_ALLOCATOR,
    AotiModel,
    AotiModelError,
    BridgeError,
    load_bridge,
    memory_stats,
)


class ConvAttentionTopk(nn.Module):
    """Patch conv -> attention (SDPA) -> bmm -> topk: the fallback ops of a typical model."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 4, stride=4)
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor):
        t = self.patch(x).flatten(2).transpose(1, 2)  # (B, 16 tokens, 16)
        q, k, v = self.qkv(t).view(t.shape[0], t.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        sim = torch.bmm(y, t.transpose(1, 2))
        return y, torch.topk(sim, 3, dim=-1).values


@pytest.fixture(scope="session")
def artifacts():
    """Compiled once per machine through the shared AOTI cache."""
    return {case.name: (exported(case), compile_exported_program(exported(case))) for case in CASES}


@pytest.fixture
def no_leaks():
    yield
    stats = memory_stats()
    assert (stats.tensors, stats.storages, stats.bytes) == (0, 0, 0), stats


def _inputs(case) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return list(case.make_inputs())


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_strided_view_model_matches_eager(name, artifacts, no_leaks):
    ep, art = artifacts[name]
    inputs = _inputs(CASES_BY_NAME[name])
    expected = ep.module()(*inputs)
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        (out,) = model.run(inputs)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.fixture
def poisoned_memory():
    """Every shim buffer starts as 0xFF bytes (NaN): unwritten output elements are visible."""
    HOST_ALLOCATOR.fill_byte = 0xFF
    yield
    HOST_ALLOCATOR.fill_byte = None


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_upstream_copy_materialization_loses_writes(name, artifacts, poisoned_memory, no_leaks):
    """Upstream Metal's always-copy reinterpret: kernels write into copies, the output misses them.

    With views kept in the parent storage (the default) the same poisoned run is exact,
    so every output element is written through the strided views.
    """
    ep, art = artifacts[name]
    inputs = _inputs(CASES_BY_NAME[name])
    expected = ep.module()(*inputs)
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        torch.testing.assert_close(model.run(inputs)[0], expected, atol=1e-5, rtol=1e-5)
    with AotiModel(
        art.so_path, art.weights_path.read_bytes(), materialize="upstream_copy"
    ) as model:
        (out,) = model.run(inputs)
    lost = torch.isnan(out) | ~torch.isclose(out, expected, atol=1e-3, rtol=1e-3)
    assert lost.any(), "upstream_copy materialization should lose writes"
    if name == "chunk_cat":
        # the fused cat kernel writes only through the two views: nothing reaches the output
        assert torch.isnan(out).all()


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_hundred_runs_keep_memory_flat_and_unload_to_zero(name, artifacts, no_leaks):
    ep, art = artifacts[name]
    inputs = _inputs(CASES_BY_NAME[name])
    expected = ep.module()(*inputs)
    model = AotiModel(art.so_path, art.weights_path.read_bytes())
    loaded = memory_stats()
    assert loaded.bytes == 0 and loaded.storages == loaded.borrowed_storages  # only constants
    for _ in range(100):
        (out,) = model.run(inputs)
        now = memory_stats()
        assert (now.tensors, now.storages, now.bytes) == (
            loaded.tensors,
            loaded.storages,
            loaded.bytes,
        )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    model.close()
    assert memory_stats().cached_bytes == 0  # no model open: the buffer cache is emptied too


def test_run_into_caller_outputs_and_borrowed_inputs(artifacts, no_leaks):
    ep, art = artifacts["narrow_last_dim"]
    (x,) = _inputs(CASES_BY_NAME["narrow_last_dim"])
    expected = ep.module()(x)
    dst = torch.full((1,), float("nan"))  # wrong shape on purpose: resized to the output's
    x_before = x.clone()
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        (got,) = model.run([x], outputs=[dst])
    assert got is dst
    torch.testing.assert_close(dst, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(x, x_before)


def test_fallback_ops_in_a_compiled_model(no_leaks):
    torch.manual_seed(0)
    module = ConvAttentionTopk().eval()
    x = torch.randn(2, 3, 16, 16)
    ep = torch.export.export(module, (x,))
    art = compile_exported_program(ep)
    calls = load_bridge().calls
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        outs = model.run([x])
    assert load_bridge().calls > calls
    for got, want in zip(outs, module(x)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_wrong_inputs_and_short_weights_are_refused(artifacts, no_leaks):
    ep, art = artifacts["chunk_cat"]
    (x,) = _inputs(CASES_BY_NAME["chunk_cat"])
    expected = ep.module()(x)
    blob = art.weights_path.read_bytes()
    with pytest.raises(AotiModelError, match="weights blob has 16 bytes"):
        AotiModel(art.so_path, blob[:16])
    with AotiModel(art.so_path, blob) as model:
        with pytest.raises(AotiModelError, match="expected 1 inputs, got 2"):
            model.run([torch.randn(4, 16), torch.randn(4, 16)])
        with pytest.raises(AotiModelError, match="unmatched dtype"):
            model.run([torch.randn(4, 16, dtype=torch.float64)])
        with pytest.raises(AotiModelError, match="unmatched dim value"):
            model.run([torch.randn(4, 8)])  # would read past the input without the check
        with pytest.raises(AotiModelError, match="unmatched stride value"):
            model.run([torch.randn(16, 4).t()])
        torch.testing.assert_close(model.run([x])[0], expected)  # still usable afterwards
    with pytest.raises(AotiModelError, match="no such file"):
        AotiModel(Path(art.so_path).with_name("missing.so"))


_FAKE_MODEL = r"""
#include <stddef.h>
#include <stdint.h>
/* a private aoti_torch_* that shadows etmetal's (bound internally with -Bsymbolic) */
int32_t aoti_torch_delete_tensor_object(void* h) { (void)h; return 0; }
%(extra)s
int32_t AOTInductorModelContainerCreateWithDevice(void** h, size_t n, const char* d, const char* c)
{ static int x; *h = &x; return 0; }
int32_t AOTInductorModelContainerDelete(void* h) { return 0; }
int32_t AOTInductorModelContainerGetNumInputs(void* h, size_t* n) { *n = 1; return 0; }
int32_t AOTInductorModelContainerGetNumOutputs(void* h, size_t* n) { *n = 0; return 0; }
int32_t AOTInductorModelContainerGetNumConstants(void* h, size_t* n) { *n = 0; return 0; }
int32_t AOTInductorModelContainerGetConstantsBlobSize(void* h, uint64_t* n) { *n = 0; return 0; }
int32_t AOTInductorModelUpdateConstantsFromBlob(void* h, const uint8_t* p) { return 0; }
int32_t AOTInductorGetLastError(const char** m) { *m = ""; return 0; }
int32_t AOTInductorModelContainerRun(void* h, void** in, size_t n_in, void** out, size_t n_out,
                                     void* s, void* p) {
  for (size_t i = 0; i < n_in; ++i) aoti_torch_delete_tensor_object(in[i]);
  %(run)s
  return 0;
}
"""


def _build_fake(tmp_path: Path, name: str, extra: str = "", run: str = "") -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    src, so = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    src.write_text(_FAKE_MODEL % {"extra": extra, "run": run})
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-Bsymbolic", "-o", str(so), str(src)],
        check=True,
        capture_output=True,
    )
    return so


def test_a_run_that_bypasses_etmetal_is_an_error(tmp_path, no_leaks):
    so = _build_fake(tmp_path, "shadowing")
    with AotiModel(so) as model, pytest.raises(BridgeError, match="no shim call"):
        model.run([torch.randn(3)])


def test_a_so_needing_unimplemented_shims_is_refused(tmp_path, no_leaks):
    so = _build_fake(
        tmp_path,
        "needs_more",
        extra="int32_t aoti_torch_cpu_not_a_real_op(void*);",
        run="aoti_torch_cpu_not_a_real_op(0);",
    )
    with pytest.raises(AotiModelError, match="aoti_torch_cpu_not_a_real_op"):
        AotiModel(so)


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(10, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx) * 2


def test_kernel_bounds_check_becomes_an_error_not_a_crash(no_leaks):
    """The kernel's AOTI_TORCH_CHECK calls etmetal's aoti_torch_check, which throws in C++."""
    torch.manual_seed(0)
    module = Lookup().eval()
    ep = torch.export.export(module, (torch.tensor([1, 2, 3]),))
    art = compile_exported_program(ep)
    with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
        good = torch.tensor([0, 4, 9])
        torch.testing.assert_close(model.run([good])[0], module(good))
        with pytest.raises(AotiModelError, match="index out of bounds"):
            model.run([torch.tensor([1, 2, 11])])
        torch.testing.assert_close(model.run([good])[0], module(good))


_SHADOW_SCRIPT = r"""
import ctypes, os, sys
ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_GLOBAL)  # loaded before etmetal
from etmetal.shims import AotiModel, BridgeError
try:
    AotiModel(sys.argv[2], open(sys.argv[3], "rb").read())
except BridgeError as exc:
    print("REFUSED", exc)
"""


def test_a_so_that_would_bind_elsewhere_is_refused(tmp_path, artifacts):
    """Another library in the global scope defining a shim first: the load must be refused."""
    cc = shutil.which("gcc") or shutil.which("cc")
    src, lib = tmp_path / "other.c", tmp_path / "libother.so"
    src.write_text(
        "#include <stdint.h>\nint32_t aoti_torch_get_dim(void* t, int64_t* d) { return 0; }\n"
    )
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    _, art = artifacts["chunk_cat"]
    script = tmp_path / "shadow.py"
    script.write_text(_SHADOW_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(lib), str(art.so_path), str(art.weights_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "REFUSED" in out.stdout and "aoti_torch_get_dim" in out.stdout, out.stdout + out.stderr
