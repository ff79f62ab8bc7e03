"""The fallbacks and utilities generated from torch's headers (``shims.fallback_codegen``)
against the Python shims, the reference: bit for bit, the same shim calls, served in C;
and the roles the generator gives each argument against the op's own ATen schema."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.shims import AotiModel, default_context, memory_stats
from etmetal.shims import fallback_codegen as gen

# ATen schema type -> the role the header's spelling and name must have given it
_SCHEMA_ROLE = {
    "Tensor": gen.TENSOR,
    "Tensor?": gen.OPTIONAL,
    "Tensor[]": gen.LIST,
    "Tensor?[]": gen.OPTIONAL_LIST,
}


def _aten_op(shim: str):
    # the host fallbacks are each an op's default overload (c_shim_cpu.h names others
    # <op>_<overload>, e.g. index_Tensor)
    return getattr(torch.ops.aten, shim.removeprefix("aoti_torch_cpu_")).default


def test_every_generated_fallback_has_the_roles_of_its_aten_schema():
    fallbacks = [e for e in gen.entries() if e.decl.name.startswith("aoti_torch_cpu_")]
    assert len(fallbacks) >= 9, [e.decl.name for e in fallbacks]
    for e in fallbacks:
        schema = _aten_op(e.decl.name)._schema
        roles = [r for r in e.roles if r != gen.LENGTH]
        inputs = [r for r in roles if r != gen.OUTPUT]
        assert roles[len(inputs) :] == [gen.OUTPUT] * len(schema.returns), e.decl.name
        assert len(inputs) == len(schema.arguments), e.decl.name
        for role, arg in zip(inputs, schema.arguments):
            want = _SCHEMA_ROLE.get(str(arg.type), gen.PASS)
            assert role == want, (e.decl.name, arg.name, str(arg.type), role)


def test_an_unlisted_tensor_spelling_is_refused_by_name():
    with pytest.raises(gen.UnsupportedSignature, match="xs: a tensor list without xs_len_"):
        gen.roles((("const AtenTensorHandle*", "xs"), ("int64_t", "n")))


@pytest.fixture
def no_leaks():
    yield
    stats = memory_stats()
    assert (stats.tensors, stats.storages, stats.bytes) == (0, 0, 0), stats


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


# (id, module, inputs, shims the native path must serve)
CASES = [
    (
        "avg_pool2d",
        _Fn(lambda x: torch.nn.functional.avg_pool2d(x, 6, 2)),
        (torch.randn(1, 2, 12, 12),),
        {"aoti_torch_cpu_avg_pool2d"},
    ),
    (
        "avg_pool3d",
        _Fn(lambda x: torch.nn.functional.avg_pool3d(x, 3, 2)),
        (torch.randn(1, 2, 6, 6, 6),),
        {"aoti_torch_cpu_avg_pool3d"},
    ),
    (
        "adaptive_avg_pool3d",
        _Fn(lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (2, 2, 2))),
        (torch.randn(1, 2, 5, 7, 9),),
        {"aoti_torch_cpu__adaptive_avg_pool3d"},
    ),
    (
        "cumsum_int",
        _Fn(lambda x: torch.cumsum(x, 1) * 3),
        (torch.randint(0, 9, (3, 70)),),
        {"aoti_torch_cpu_cumsum"},
    ),
    (
        "lstm",
        nn.LSTM(8, 16, batch_first=True).eval(),
        (torch.randn(2, 5, 8),),
        {"aoti_torch_cpu_mkldnn_rnn_layer"},
    ),
]


def _steady(art, inputs, shims: str, runs: int = 2):
    with AotiModel(art.so_path, art.weights_path.read_bytes(), shims=shims) as model:
        first = [t.clone() for t in model.run(list(inputs))]
        before = model.stats()
        for _ in range(runs):
            last = [t.clone() for t in model.run(list(inputs))]
        after = model.stats()
    counts = {}
    for name, c in after.items():
        was = before.get(name, {"native": 0, "python": 0})
        d = (c["native"] - was["native"], c["python"] - was["python"])
        if d != (0, 0):
            counts[name] = d
    return first, last, counts


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_generated_paths_are_bit_identical_to_python_and_stay_in_c(case, no_leaks):
    _, module, inputs, served = case
    art = compile_exported_program(torch.export.export(module, inputs))
    n_first, n_last, native = _steady(art, inputs, "native")
    p_first, p_last, python = _steady(art, inputs, "python")
    for a, b in zip([*n_first, *n_last], [*p_first, *p_last]):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b)
    with torch.no_grad():
        want = module(*inputs)
    flat = list(want) if isinstance(want, tuple) else [want]
    flat = [w for x in flat for w in (x if isinstance(x, tuple) else (x,))]
    for got, ref in zip(n_last, flat):
        torch.testing.assert_close(got, ref)
    assert {n: sum(c) for n, c in native.items()} == {n: sum(c) for n, c in python.items()}
    generated = set(gen.native_paths()) & set(native)
    for name in served | generated:
        assert native[name][0] > 0 and native[name][1] == 0, (name, native)
        assert python[name][0] == 0, (name, python)
    # new_tensor_handle outside a load (and the delete of its alias) stays Python's
    # (native_tensors: etm_native_alias serves only while constants load)
    alias = {"aoti_torch_new_tensor_handle", "aoti_torch_delete_tensor_object"}
    python_side = {n: p for n, (_, p) in native.items() if p}
    assert not python_side or "aoti_torch_new_tensor_handle" in python_side, python_side
    assert set(python_side) <= alias, python_side


def _handle(ctx, t):
    from etmetal.shims.storage import Storage, tensor_from_torch

    u = t.untyped_storage()
    return ctx.register(tensor_from_torch(t, Storage(u.data_ptr(), u.nbytes(), owned=False)))


def _served_once(bridge, name: str, call) -> tuple[int, tuple[int, int]]:
    before = bridge.shim_counts().get(name, (0, 0))
    rc = call()
    after = bridge.shim_counts()[name]
    return rc, (after[0] - before[0], after[1] - before[1])


def test_utilities_write_in_place_in_c_and_refuse_what_python_must_name(no_leaks):
    """copy_, zero_ and item_* as a .so calls them: served in C where libtorch's answer is
    the Python shim's, else the Python shim serves or names the error."""
    import ctypes

    ctx = default_context()
    bridge = ctx.load_bridge()
    src = torch.randn(3, 5)
    dst = torch.zeros(5, 3).t()  # strided destination
    ints = torch.zeros(3, 5, dtype=torch.int32)
    one = torch.tensor([2.5])
    one_int = torch.tensor([7], dtype=torch.int32)
    hs = [_handle(ctx, t) for t in (src, dst, ints, one, one_int)]
    h_src, h_dst, h_ints, h_one, h_one_int = hs
    try:
        copy_ = bridge.c_function("aoti_torch_copy_")
        rc, d = _served_once(bridge, "aoti_torch_copy_", lambda: copy_(h_dst, h_src, 0))
        assert (rc, d) == (0, (1, 0)) and torch.equal(dst, src)
        # another dtype: Python's shim refuses it by name (libtorch would convert)
        rc, d = _served_once(bridge, "aoti_torch_copy_", lambda: copy_(h_ints, h_src, 0))
        assert (rc, d) == (1, (0, 1)) and "dtype mismatch" in ctx.last_error()
        assert torch.equal(ints, torch.zeros(3, 5, dtype=torch.int32))

        zero_ = bridge.c_function("aoti_torch_zero_")
        rc, d = _served_once(bridge, "aoti_torch_zero_", lambda: zero_(h_dst))
        assert (rc, d) == (0, (1, 0)) and torch.equal(dst, torch.zeros(3, 5))

        item = bridge.c_function("aoti_torch_item_float32")
        value = ctypes.c_float()
        rc, d = _served_once(
            bridge, "aoti_torch_item_float32", lambda: item(h_one, ctypes.byref(value))
        )
        assert (rc, d) == (0, (1, 0)) and value.value == 2.5
        rc, d = _served_once(
            bridge, "aoti_torch_item_float32", lambda: item(h_one_int, ctypes.byref(value))
        )
        assert (rc, d) == (1, (0, 1)) and "is not float32" in ctx.last_error()
    finally:
        for h in hs:
            ctx.unregister(h)
