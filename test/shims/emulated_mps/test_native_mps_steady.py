"""The emulated Metal device's steady state served in C: native mps tensors (device 13
records of the bridge), the ``aoti_torch_mps_*`` fallbacks on the host's native paths, the
math attention through libtorch's dispatcher and the convolution with torch's layout rule.

Each model runs on both implementations: the Python shims (the reference, chosen with
``shims="python"``) and the native one. Outputs must be bit-identical, close to eager
PyTorch, the same shims must be called as often on both sides, and natively no steady call
may reach Python. 10,000 executes leave RSS and live native storages flat.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.common.fallback_table import all_fallback_shims
from etmetal.examples import metal_registry
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.shims import AotiModel, default_context, memory_stats
from etmetal.shims.emulated_mps import mps_device
from etmetal.testing.resident import resident_bytes
from etmetal.testing.shim_counts import (
    context_counts,
    delta,
    lm_steps_on_each_implementation,
    model_counts,
    steady_runs,
)

TARGET = "mps_emulated"
IN_C = list(metal_registry.REGISTRY)
MPS_FALLBACKS = {n for n in all_fallback_shims() if n.startswith("aoti_torch_mps_")}

_ARTS: dict[str, object] = {}


@pytest.fixture
def no_leaks():
    yield
    stats = memory_stats()
    assert (stats.tensors, stats.storages, stats.bytes) == (0, 0, 0), stats
    assert mps_device.live_mps_storages(default_context()) == 0


def _compiled(key: str, module, inputs):
    if key not in _ARTS:
        with torch.no_grad():
            ep = torch.export.export(module.eval(), tuple(inputs))
        _ARTS[key] = compile_exported_program(ep, target=TARGET)
    return _ARTS[key]


def _steady(art, inputs, shims: str, runs: int = 3):
    """Outputs of the first run, of the last steady run, and per-shim counts of ``runs``
    steady runs after the first two."""
    with AotiModel(art.so_path, art.weights_bytes(), device="mps", shims=shims) as model:
        return steady_runs(model, inputs, runs, settle=1)


def _both(art, inputs):
    native = _steady(art, inputs, "native")
    python = _steady(art, inputs, "python")
    for a, b in zip([*native[0], *native[1]], [*python[0], *python[1]]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    # the same shims are called as often on both sides
    assert {n: sum(c) for n, c in native[2].items()} == {n: sum(c) for n, c in python[2].items()}
    return native, python


def _fallbacks_went_to_python(python_counts: dict) -> None:
    """The reference really is the Python one: its mps fallbacks all reached Python."""
    fallbacks = [n for n in python_counts if n in MPS_FALLBACKS]
    assert all(python_counts[n] == (0, sum(python_counts[n])) for n in fallbacks), python_counts


@pytest.mark.parametrize("demo", DEMO_MODELS, ids=lambda d: d.name)
def test_demo_models_steady_state_makes_no_python_call(demo, no_leaks):
    module, inputs = get_demo(demo.name)
    art = _compiled(f"demo:{demo.name}", module, inputs)
    (_, out, native), (_, _, python) = _both(art, inputs)
    assert sum(p for _, p in native.values()) == 0, native
    assert sum(p for _, p in python.values()) > 0, python
    _fallbacks_went_to_python(python)
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for got, ref in zip(out, want):
        torch.testing.assert_close(got, ref, atol=demo.atol, rtol=demo.rtol)


@pytest.mark.parametrize("name", IN_C)
def test_registry_module_steady_state_makes_no_python_call(name, no_leaks):
    entry = metal_registry.REGISTRY[name]
    module, inputs = metal_registry.get_model_and_inputs(name)
    art = _compiled(f"registry:{name}", module, inputs)
    (_, out, native), (_, _, python) = _both(art, inputs)
    assert sum(p for _, p in native.values()) == 0, native
    assert sum(p for _, p in python.values()) > 0, python
    _fallbacks_went_to_python(python)
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for got, ref in zip(out, want):
        torch.testing.assert_close(got, ref, atol=entry.atol, rtol=entry.rtol)


class _UnevenPools(torch.nn.Module):
    """The pools Inductor leaves to ``aoti_torch_mps_*`` fallbacks (uneven adaptive windows,
    an average window too large to unroll)."""

    def forward(self, x):
        uneven = torch.ops.aten._adaptive_avg_pool2d(x, [5, 3])
        return uneven, torch.nn.functional.avg_pool2d(x, 7, stride=2, ceil_mode=True)


def test_mps_pool_fallbacks_run_on_the_host_paths_in_c(no_leaks):
    module, inputs = _UnevenPools().eval(), [torch.randn(2, 3, 40, 37)]
    art = _compiled("pools", module, inputs)
    (_, out, native), _ = _both(art, inputs)
    for op in ("_adaptive_avg_pool2d", "avg_pool2d"):
        assert native.get(f"aoti_torch_mps_{op}", (0, 0))[0] > 0, native
    assert sum(p for _, p in native.values()) == 0, native
    with torch.no_grad():
        want = module(*inputs)
    for got, ref in zip(out, want):
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


def test_a_convolution_on_channels_last_operands_follows_torchs_mps_layout_rule(no_leaks):
    """Inductor hands the patch embedding's convolution channels-last operands; the host
    kernel keeps that layout, torch's mps rule asks for another one: C repacks the result
    as the Python shim does (bit for bit), with no Python call."""
    module, inputs = get_demo("patch_embedding")
    art = _compiled("demo:patch_embedding", module, inputs)
    (_, _, native), (_, _, python) = _both(art, inputs)
    assert native["aoti_torch_mps_convolution"][1] == 0
    assert python["aoti_torch_mps_convolution"][0] == 0


def test_the_checker_and_the_python_implementation_keep_mps_tensors_in_python(no_leaks):
    """The Python device and the native tables agree: while the Metal checker poisons new
    mps memory, or a Python-shim model is open, no mps tensor is allocated in C."""
    ctx = default_context()
    native = ctx.load_bridge() and ctx.native
    assert native.mps_limit > 0
    previous = mps_device.set_metal_check(ctx, "memcheck")
    try:
        assert native.mps_limit == 0
    finally:
        mps_device.set_metal_check(ctx, previous)
    assert native.mps_limit > 0
    old = ctx.set_implementation("python")
    try:
        assert native.mps_limit == 0
    finally:
        ctx.set_implementation(old)
    assert native.mps_limit > 0


@pytest.fixture(scope="module")
def mps_lm(tmp_path_factory):
    """The tiny two-method LM lowered for the emulated device (prefill, decode)."""
    from etmetal.bench.llm import PROMPT
    from etmetal.examples import llm

    model = llm.make_decoder_lm(llm.CONFIGS["tiny"])
    program = llm.lower_methods(llm.lm_exports(model, prompt_len=PROMPT), target=TARGET)
    return program.buffer


def test_lm_decode_is_bit_identical_and_stays_in_c(mps_lm, no_leaks):
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    arms = lm_steps_on_each_implementation(mps_lm, default_context(), prompt)
    (native_out, native), (python_out, python) = arms["native"], arms["python"]
    for a, b in zip(native_out, python_out, strict=True):
        assert torch.equal(a, b)
    assert {n: sum(c) for n, c in native.items()} == {n: sum(c) for n, c in python.items()}
    assert native["aoti_torch_mps_mm_out"][0] > 0
    assert sum(p for _, p in native.values()) == 0, native
    assert python["aoti_torch_mps_mm_out"] == (0, sum(python["aoti_torch_mps_mm_out"]))


@pytest.mark.rss_flat  # measures RSS: not under ASan (etmetal regress sanitize)
def test_10000_executes_leave_rss_and_native_storages_flat(no_leaks):
    """Native mps tensors, mps fallbacks' results and their views are all given back."""
    module, inputs = get_demo("patch_embedding")
    art = _compiled("demo:patch_embedding", module, inputs)
    ctx = default_context()
    with AotiModel(art.so_path, art.weights_bytes(), device="mps") as model:
        for _ in range(2000):
            model.run(list(inputs))
        before = model_counts(model)
        live0, mps0, rss0 = memory_stats(), mps_device.live_mps_storages(ctx), resident_bytes()
        for _ in range(10_000):
            out = model.run(list(inputs))
        live1, mps1, rss1 = memory_stats(), mps_device.live_mps_storages(ctx), resident_bytes()
        counts = delta(model_counts(model), before)
    assert (live1.tensors, live1.storages, live1.bytes) == (
        live0.tensors,
        live0.storages,
        live0.bytes,
    )
    assert mps1 == mps0
    assert rss1 - rss0 < 1 << 20, f"RSS grew {(rss1 - rss0) / 1024:.0f} KiB"
    assert sum(p for _, p in counts.values()) == 0, counts
    assert counts["aoti_torch_mps_convolution"] == (10_000, 0)
    assert out[0].shape == module(*inputs).shape


def test_bad_arguments_leave_c_for_the_python_shim_which_names_them(no_leaks):
    """Called as a .so calls them: C serves what it is sure of, anything else reaches the
    Python shim, which reports it by name (nothing is written, nothing leaks)."""
    from etmetal.shims.abi_codes import DEVICE_MPS
    from etmetal.shims.storage import Storage, tensor_from_torch

    ctx = default_context()
    bridge = ctx.load_bridge()
    mm = bridge.c_function("aoti_torch_mps_mm_out")
    int4 = bridge.c_function("aoti_torch_mps__linear_fp_act_4bit_weight")

    def handle(t):
        u = t.untyped_storage()
        storage = Storage(u.data_ptr(), u.nbytes(), owned=False, device_type=DEVICE_MPS)
        return ctx.register(tensor_from_torch(t, storage))

    def served(name):
        return bridge.shim_counts().get(name, (0, 0))

    a, b, out = torch.randn(3, 4), torch.randn(4, 5), torch.zeros(3, 5)
    packed = torch.randint(0, 255, (8, 32), dtype=torch.uint8)
    scales, zeros = torch.ones(8, 2), torch.zeros(8, 2)
    tensors = (a, b, out, torch.randn(2, 64), packed, scales, zeros)
    ha, hb, ho, hx, hp, hs, hz = handles = [handle(t) for t in tensors]
    try:
        n0, p0 = served("aoti_torch_mps_mm_out")
        assert mm(ho, ha, hb) == 0 and torch.equal(out, a @ b)
        assert served("aoti_torch_mps_mm_out") == (n0 + 1, p0)  # served in C
        assert mm(ho, hb, ha) == 1  # (4, 5) @ (3, 4)
        assert "cannot multiply [4, 5] by [3, 4]" in ctx.last_error()
        assert served("aoti_torch_mps_mm_out") == (n0 + 1, p0 + 1)
        ret = ctypes.c_void_p()
        assert int4(hx, hp, 48, hs, hz, ctypes.addressof(ret)) == 1 and not ret.value
        assert "group_size must be one of" in ctx.last_error()
    finally:
        for h in handles:
            ctx.unregister(h)


def test_a_copy_from_a_native_mps_tensor_is_checked_against_its_storage(no_leaks):
    """A copy source only a native record knows is accepted inside its storage and
    refused past it, as a Python tensor's is."""
    from etmetal.shims.abi_codes import DEVICE_MPS

    ctx = default_context()
    bridge = ctx.load_bridge()
    empty = bridge.c_function("aoti_torch_empty_strided")
    delete = bridge.c_function("aoti_torch_delete_tensor_object")
    data_ptr = bridge.c_function("aoti_torch_get_data_ptr")
    malloc, free = (
        bridge.c_function("aoti_torch_mps_malloc"),
        bridge.c_function("aoti_torch_mps_free"),
    )
    copy = bridge.c_function("aoti_torch_mps_copy_buffer")
    sizes = (ctypes.c_int64 * 1)(64)
    handle, ptr, buf = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert empty(1, sizes, None, 6, DEVICE_MPS, 0, ctypes.addressof(handle)) == 0
    try:
        assert ctx.native.read(handle.value).device_type == DEVICE_MPS  # a native mps record
        assert data_ptr(handle, ctypes.addressof(ptr)) == 0
        ctypes.memmove(ptr.value, bytes(range(256)), 256)
        assert malloc(ctypes.addressof(buf), 256) == 0
        try:
            assert copy(ptr, buf, 256, 0, 0) == 0
            assert ctypes.string_at(buf.value, 256) == bytes(range(256))
            assert copy(ptr, buf, 256, 8, 0) == 1  # 8 bytes past the tensor's storage
            assert "not inside" in ctx.last_error()
        finally:
            assert free(buf) == 0
    finally:
        assert delete(handle) == 0


@pytest.mark.parametrize("shims", ["native", "python"])
def test_an_mps_scan_runs_the_host_path_and_its_result_is_an_mps_tensor(shims, no_leaks):
    """``aoti_torch_mps_cumsum`` on the host's generated path: served in C natively, by the
    Python shim for the reference; the same bits and an mps result either way."""
    from etmetal.shims.abi_codes import DEVICE_MPS
    from etmetal.shims.storage import Storage, tensor_from_torch

    ctx = default_context()
    bridge = ctx.load_bridge()
    cumsum = bridge.c_function("aoti_torch_mps_cumsum")
    device_type = bridge.c_function("aoti_torch_get_device_type")
    x = torch.randn(4, 33)
    u = x.untyped_storage()
    hx = ctx.register(
        tensor_from_torch(x, Storage(u.data_ptr(), u.nbytes(), owned=False, device_type=DEVICE_MPS))
    )
    previous = ctx.set_implementation(shims)
    ret, dev = ctypes.c_void_p(), ctypes.c_int32()
    try:
        before = bridge.shim_counts().get("aoti_torch_mps_cumsum", (0, 0))
        assert cumsum(hx, 1, None, ctypes.addressof(ret)) == 0
        after = bridge.shim_counts()["aoti_torch_mps_cumsum"]
        assert (after[0] - before[0], after[1] - before[1]) == (
            (1, 0) if shims == "native" else (0, 1)
        )
        assert device_type(ret, ctypes.addressof(dev)) == 0 and dev.value == DEVICE_MPS
        assert torch.equal(ctx.lookup(ret.value).torch(), torch.cumsum(x, 1))
    finally:
        ctx.set_implementation(previous)
        if ret.value:
            ctx.unregister(ret.value)
        ctx.unregister(hx)


def test_a_launch_that_fails_in_a_steady_run_fails_the_run(no_leaks):
    """The Metal wrapper ignores its launches' return codes: a steady run (one etm_run)
    still reads the device's sticky error afterwards and fails, and recovers after."""
    from etmetal.shims.model_run import AotiModelError

    module, inputs = metal_registry.get_model_and_inputs("add")
    art = _compiled("registry:add", module, inputs)
    lib = default_context().load_bridge().lib
    limit = ctypes.c_uint64.in_dll(lib, "etm_mps_launch_limit")
    with AotiModel(art.so_path, art.weights_bytes(), device="mps") as model:
        for _ in range(3):  # the steady run serves from the second run on
            (good,) = model.run(list(inputs))
        saved, limit.value = limit.value, 1  # every launch is now refused, in C
        try:
            with pytest.raises(AotiModelError, match="does not check failed"):
                model.run(list(inputs))
        finally:
            limit.value = saved
        (again,) = model.run(list(inputs))
    assert torch.equal(good, again)


@pytest.mark.parametrize("name", ["mm_weight_param", "linear_bias", "gather_qmv"])
def test_a_pte_method_for_the_emulated_device_stays_in_c(name, no_leaks):
    """Through a .pte method (the runtime's delegate call, not AotiModel.run): the inputs
    are lent as mps records and the weights stay in C, so a steady execute makes no
    Python call (the prepared one-call run serves it, as on the host)."""
    from etmetal.backend.lowering import lower
    from etmetal.runtime import Runtime

    entry = metal_registry.REGISTRY[name]
    module, inputs = metal_registry.get_model_and_inputs(name)
    program, _ = lower(module.eval(), tuple(inputs), target=TARGET, runtime="etmetal")
    ctx = default_context()
    method = (
        Runtime.get().load_program(program.buffer, trust_native_code=True).load_method("forward")
    )
    for _ in range(2):
        method.execute(list(inputs))
    before = context_counts(ctx)
    for _ in range(3):
        (out,) = method.execute(list(inputs))
    counts = delta(context_counts(ctx), before)
    method.destroy()
    del method
    assert sum(p for _, p in counts.values()) == 0, counts
    assert any(n.startswith("aoti_torch_mps_") and c[0] >= 3 for n, c in counts.items()), counts
    with torch.no_grad():
        torch.testing.assert_close(out, module(*inputs), atol=entry.atol, rtol=entry.rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shims", ["native", "python"])
def test_an_mps_convolution_repacks_its_result_bit_for_bit(dtype, shims, no_leaks):
    """``aoti_torch_mps_convolution`` on channels-last operands (odd sizes, 2-, 4- and
    8-byte items): the host kernel's channels-last result is repacked contiguous, as torch's
    mps rule asks, with the bits of eager's result made contiguous; in C natively."""
    from etmetal.shims.abi_codes import DEVICE_MPS
    from etmetal.shims.storage import Storage, tensor_from_torch

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 7, 9, generator=gen).to(dtype).to(memory_format=torch.channels_last)
    w = torch.randn(6, 5, 3, 2, generator=gen).to(dtype).to(memory_format=torch.channels_last)
    b = torch.randn(6, generator=gen).to(dtype)
    want = torch.nn.functional.conv2d(x, w, b, stride=(2, 1), padding=(1, 0)).contiguous()
    ctx = default_context()
    bridge = ctx.load_bridge()
    conv = bridge.c_function("aoti_torch_mps_convolution")
    handles = []
    for t in (x, w, b):
        u = t.untyped_storage()
        storage = Storage(u.data_ptr(), u.nbytes(), owned=False, device_type=DEVICE_MPS)
        handles.append(ctx.register(tensor_from_torch(t, storage)))
    pairs = [(ctypes.c_int64 * 2)(*v) for v in ((2, 1), (1, 0), (1, 1), (0, 0))]
    previous = ctx.set_implementation(shims)
    ret = ctypes.c_void_p()
    try:
        before = bridge.shim_counts().get("aoti_torch_mps_convolution", (0, 0))
        args = [a for p in pairs[:3] for a in (p, 2)]
        bias = ctypes.c_void_p(handles[2])  # an optional tensor: passed by pointer
        rc = conv(
            handles[0],
            handles[1],
            ctypes.addressof(bias),
            *args,
            0,
            pairs[3],
            2,
            1,
            ctypes.addressof(ret),
        )
        assert rc == 0, ctx.last_error()
        after = bridge.shim_counts()["aoti_torch_mps_convolution"]
        assert (after[0] - before[0], after[1] - before[1]) == (
            (1, 0) if shims == "native" else (0, 1)
        )
        got = ctx.lookup(ret.value).torch()
        assert got.is_contiguous() and got.dtype == dtype
        assert torch.equal(got, want)
    finally:
        ctx.set_implementation(previous)
        if ret.value:
            ctx.unregister(ret.value)
        for h in handles:
            ctx.unregister(h)
