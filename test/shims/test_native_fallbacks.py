"""The fallbacks and constants served in C (``shims.native_fallbacks``) against the Python
shims, the reference: the same outputs bit for bit, the same shim calls, and a steady
run of the demo models that never reaches Python."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.examples import metal_registry
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.shims import AotiModel, default_context, memory_stats
from etmetal.shims import native_fallbacks as nf
from etmetal.shims.abi import declarations
from etmetal.testing.shim_counts import lm_steps_on_each_implementation, steady_runs

# the whole registry (its fallbacks: mm, addmm, convolution, attention, topk, and the
# custom operators: the int4 linears, metal::gather_qmv, metal::gated_delta_rule)
REGISTRY_SAMPLE = tuple(metal_registry.REGISTRY)


@pytest.fixture
def no_leaks():
    yield
    stats = memory_stats()
    assert (stats.tensors, stats.storages, stats.bytes) == (0, 0, 0), stats


def _compiled(module, inputs):
    return compile_exported_program(torch.export.export(module, tuple(inputs)))


def _steady(art, inputs, shims: str, runs: int = 3):
    """Outputs of the first and last runs, and per-shim counts of ``runs`` runs after the first."""
    with AotiModel(art.so_path, art.weights_path.read_bytes(), shims=shims) as model:
        return steady_runs(model, inputs, runs)


def test_every_libtorch_function_is_bound_with_its_header_signature():
    bridge = default_context().load_bridge()
    decls = declarations()
    assert set(bridge.libtorch_functions) >= {
        "aoti_torch_cpu_mm_out",
        "aoti_torch_cpu_addmm_out",
        "aoti_torch_create_tensor_from_blob",
        "aoti_torch_delete_tensor_object",
    }
    for name, sig in bridge.libtorch_functions.items():
        assert sig == nf.signature(decls[name]), name


def test_the_implementation_option_is_checked():
    with pytest.raises(ValueError, match="shims must be one of"):
        AotiModel("/nonexistent.so", shims="fortran")
    with pytest.raises(ValueError, match="shims must be one of"):
        default_context().set_implementation("c")


@pytest.mark.parametrize("demo", DEMO_MODELS, ids=lambda d: d.name)
def test_demo_models_run_with_no_python_shim_call_and_match_the_reference(demo, no_leaks):
    module, inputs = get_demo(demo.name)
    art = _compiled(module, inputs)
    native_first, native_out, native = _steady(art, inputs, "native")
    python_first, python_out, python = _steady(art, inputs, "python")
    # bit for bit against the Python shims, and close to eager
    for a, b in zip([*native_first, *native_out], [*python_first, *python_out]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for got, ref in zip(native_out, want):
        torch.testing.assert_close(got, ref, atol=demo.atol, rtol=demo.rtol)
    # the same shims are called as often on both sides; natively none reaches Python
    assert {n: sum(c) for n, c in native.items()} == {n: sum(c) for n, c in python.items()}
    assert sum(p for _, p in native.values()) == 0, native
    # ... and the reference really is the Python one: its fallbacks all went to Python
    fallbacks = [n for n in python if n.startswith("aoti_torch_cpu_")]
    assert fallbacks and all(python[n] == (0, sum(python[n])) for n in fallbacks)


def test_transformer_block_counts_its_four_linears_and_one_attention(no_leaks):
    module, inputs = get_demo("transformer_block")
    linears = sum(isinstance(m, torch.nn.Linear) for m in module.modules())
    _, _, counts = _steady(get_compiled_cached(module, inputs), inputs, "native", runs=5)
    assert counts["aoti_torch_cpu_addmm_out"] == (5 * linears, 0)
    assert counts["aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu"] == (5, 0)


_ARTS: dict[str, object] = {}


def get_compiled_cached(module, inputs):
    key = type(module).__name__
    if key not in _ARTS:
        _ARTS[key] = _compiled(module, inputs)
    return _ARTS[key]


@pytest.mark.parametrize("name", REGISTRY_SAMPLE)
def test_registry_sample_is_bit_identical_on_both_implementations(name, no_leaks):
    module, inputs = metal_registry.get_model_and_inputs(name)
    art = _compiled(module, inputs)
    native_first, native_out, native = _steady(art, inputs, "native")
    python_first, python_out, python = _steady(art, inputs, "python")
    for a, b in zip([*native_first, *native_out], [*python_first, *python_out]):
        assert torch.equal(a, b), name
    assert {n: sum(c) for n, c in native.items()} == {n: sum(c) for n, c in python.items()}
    # every shim of these is served natively: no call reaches Python
    assert sum(p for _, p in native.values()) == 0, native
    assert sum(p for _, p in python.values()) > 0, python


def test_a_strided_out_keeps_the_python_scatter_and_a_bad_shape_is_named(tmp_path, no_leaks):
    """Called as a .so calls them: an ``out`` with holes is Python's (its write is not
    lost), and mismatched shapes reach Python's shim, which names them."""
    bridge = default_context().load_bridge()
    fn = bridge.c_function("aoti_torch_cpu_mm_out")
    ctx = default_context()
    from etmetal.shims.storage import Storage, tensor_from_torch

    a, b = torch.randn(3, 4), torch.randn(4, 5)
    big = torch.zeros(3, 10)
    out = big[:, ::2]  # holes

    def handle(t):
        u = t.untyped_storage()
        return ctx.register(tensor_from_torch(t, Storage(u.data_ptr(), u.nbytes(), owned=False)))

    ha, hb, ho = handle(a), handle(b), handle(out)
    before = bridge.shim_counts().get("aoti_torch_cpu_mm_out", (0, 0))
    try:
        assert fn(ho, ha, hb) == 0
        assert torch.equal(out, a @ b) and torch.equal(big[:, 1::2], torch.zeros(3, 5))
        after = bridge.shim_counts()["aoti_torch_cpu_mm_out"]
        assert (after[0] - before[0], after[1] - before[1]) == (0, 1)  # Python served it
        assert fn(ho, hb, ha) == 1  # (4, 5) @ (3, 4)
        assert "cannot multiply [4, 5] by [3, 4]" in ctx.last_error()
    finally:
        for h in (ha, hb, ho):
            ctx.unregister(h)


def test_the_two_method_lm_is_bit_identical_and_decode_stays_in_c(tiny_lm_programs, no_leaks):
    from etmetal.bench.llm import program_paths

    pte = Path(program_paths("tiny", tiny_lm_programs)["shared"]).read_bytes()
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    arms = lm_steps_on_each_implementation(pte, default_context(), prompt)
    (native_out, native), (python_out, python) = arms["native"], arms["python"]
    for a, b in zip(native_out, python_out, strict=True):
        assert torch.equal(a, b)
    assert {n: sum(c) for n, c in native.items()} == {n: sum(c) for n, c in python.items()}
    assert native["aoti_torch_cpu_mm_out"][1] == 0 and native["aoti_torch_cpu_mm_out"][0] > 0
    assert sum(p for _, p in native.values()) == 0, native
    assert sum(p for _, p in python.values()) > 0


def test_a_copy_of_a_model_in_another_context_counts_apart(tmp_path, no_leaks):
    """Counts are per context (each has its own trampoline): a model in a fresh context
    starts from zero."""
    from etmetal.shims.standard_context import standard_context

    module, inputs = metal_registry.get_model_and_inputs("mm")
    art = _compiled(module, inputs)
    so = tmp_path / "copy.so"
    shutil.copy(art.so_path, so)
    ctx = standard_context()
    with AotiModel(so, art.weights_path.read_bytes(), context=ctx) as model:
        model.run(list(inputs))
        counts = model.stats()
    assert counts["aoti_torch_cpu_mm_out"] == {"native": 1, "python": 0}


# ---- the custom operators' shims (native_custom_ops.cpp) against the Python references ----


def _custom_op_cases(gen: torch.Generator) -> list[tuple[str, list[torch.Tensor], int | None]]:
    """(operator, tensor arguments, int argument) cases the registry does not cover: grouped
    keys, a key width that is no multiple of the sum's lanes, strided operands, repeated
    experts, int64 indices and a recurrence large enough for ATen to reduce in parallel."""
    from executorch.backends.apple.metal.ops.gather_qmv import _quantize_int4_affine

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    def recurrence(b, t, hk, dk, hv, dv, strided=False):
        q = rnd(b, hk, t, dk).transpose(1, 2) if strided else rnd(b, t, hk, dk)
        g = torch.rand(b, t, hv, generator=gen)
        return [
            q,
            rnd(b, t, hk, dk),
            rnd(b, t, hv, dv),
            g,
            torch.rand(b, t, hv, generator=gen),
            rnd(b, hv, dv, dk),
        ]

    w, s, z = _quantize_int4_affine(rnd(3, 24, 64), 16)
    w32, s32, z32 = _quantize_int4_affine(rnd(3, 24, 64), 32)
    x = rnd(64, 5).t()  # a strided [5, 64]
    return [
        ("gated_delta_rule", recurrence(2, 3, 2, 40, 4, 24), None),
        ("gated_delta_rule", recurrence(1, 2, 4, 128, 8, 64, strided=True), None),
        ("gather_qmv", [x, w, s, z, torch.tensor([2, 0, 2, 2, 1])], 16),
        ("gather_qmv", [x.contiguous(), w32, s32, z32, torch.tensor([1, 1, 0, 2, 0]).int()], 32),
    ]


def _call_custom_op(ctx, name: str, args: list[torch.Tensor], group, device: int):
    """Run shim ``name`` on copies of ``args`` (registered as Python tensors of ``device``):
    its return code, its result and the arguments after the call, and its (C, Python)
    counts."""
    import ctypes

    from etmetal.shims.storage import Storage, tensor_from_torch

    bridge = ctx.load_bridge()
    fn = bridge.c_function(name)
    # fresh copies with the same strides: the state written back is each run's own
    copies = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype).copy_(a) for a in args]

    def handle(t):
        u = t.untyped_storage()
        storage = Storage(u.data_ptr(), u.nbytes(), owned=False, device_type=device)
        return ctx.register(tensor_from_torch(t, storage))

    handles = [handle(c) for c in copies]
    ret = ctypes.c_void_p()
    before = bridge.shim_counts().get(name, (0, 0))
    call = [*handles[:5], group, *handles[5:]] if group is not None else handles
    try:
        rc = fn(*call, ctypes.addressof(ret))
        after = bridge.shim_counts()[name]
        out = ctx.lookup(ret.value).torch().clone() if rc == 0 else None
    finally:
        if ret.value:
            ctx.unregister(ret.value)
        for h in handles:
            ctx.unregister(h)
    return rc, out, copies, (after[0] - before[0], after[1] - before[1])


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_custom_op_shims_in_c_are_bit_identical_to_the_python_references(device, no_leaks):
    """Each custom operator's shim, called as a .so calls it: natively served in C, with the
    Python shim's bits (the result and the state it writes back), on both devices."""
    from etmetal.shims.abi_codes import DEVICE_MPS

    ctx = default_context()
    code = DEVICE_MPS if device == "mps" else 0
    for op, args, group in _custom_op_cases(torch.Generator().manual_seed(0)):
        name = f"aoti_torch_{device}_{op}"
        runs = {}
        for shims in ("native", "python"):
            previous = ctx.set_implementation(shims)
            try:
                runs[shims] = _call_custom_op(ctx, name, args, group, code)
            finally:
                ctx.set_implementation(previous)
        (rc_n, out_n, args_n, counts_n), (rc_p, out_p, args_p, counts_p) = (
            runs["native"],
            runs["python"],
        )
        assert (rc_n, rc_p) == (0, 0), ctx.last_error()
        assert (counts_n, counts_p) == ((1, 0), (0, 1)), (name, counts_n, counts_p)
        assert out_n.dtype == out_p.dtype and torch.equal(out_n, out_p), name
        for a, b in zip(args_n, args_p):  # gated_delta_rule's new state, bit for bit
            assert torch.equal(a, b), name
        with torch.no_grad():  # and the reference really is ExecuTorch's
            want = (
                getattr(torch.ops.metal, op)(*[a.clone() for a in args[:5]], group)
                if (group is not None)
                else getattr(torch.ops.metal, op)(*[a.clone() for a in args])
            )
        assert torch.equal(out_p, want), name


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_a_bad_expert_index_leaves_c_for_the_python_shim_which_names_it(device, no_leaks):
    from etmetal.shims.abi_codes import DEVICE_MPS

    ctx = default_context()
    gen = torch.Generator().manual_seed(1)
    from executorch.backends.apple.metal.ops.gather_qmv import _quantize_int4_affine

    w, s, z = _quantize_int4_affine(torch.randn(2, 8, 32, generator=gen), 32)
    args = [torch.randn(3, 32, generator=gen), w, s, z, torch.tensor([0, 2, 1])]
    code = DEVICE_MPS if device == "mps" else 0
    rc, out, _, counts = _call_custom_op(ctx, f"aoti_torch_{device}_gather_qmv", args, 32, code)
    assert rc == 1 and out is None and counts == (0, 1)
    assert "expert index out of range [0, 2): 0..2" in ctx.last_error()


def test_shim_counts_made_concurrently_outside_a_run_are_all_kept(tmp_path):
    """Shims called from several threads at once, outside any model run (no run lock),
    each count: the counters are atomic adds. Each thread calls the shim in a C loop (the
    GIL released for the whole loop), so the calls really overlap."""
    import ctypes
    import threading

    from etmetal.common.native_build import build_sources

    src = tmp_path / "hammer.c"
    src.write_text(
        "#include <stdint.h>\n"
        "void hammer(_Bool (*fn)(void), int64_t n) { for (int64_t i = 0; i < n; i++) fn(); }\n"
    )
    hammer = ctypes.CDLL(str(build_sources("test", "libhammer.so", [src]))).hammer
    hammer.argtypes, hammer.restype = [ctypes.c_void_p, ctypes.c_int64], None
    bridge = default_context().load_bridge()
    name, threads, calls = "aoti_torch_grad_mode_is_enabled", 4, 20_000_000
    address = ctypes.cast(getattr(bridge.lib, name), ctypes.c_void_p).value
    before = bridge.shim_counts().get(name, (0, 0))
    workers = [threading.Thread(target=hammer, args=(address, calls)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    after = bridge.shim_counts()[name]
    assert (after[0] - before[0], after[1] - before[1]) == (threads * calls, 0)
