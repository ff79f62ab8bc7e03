"""The native proxy executor (``shims.proxy_native``) against the Python one, the
reference: models whose ``.so`` calls operators without a C shim give bit-identical
outputs on both (and match eager), a steady run on the native implementation makes no
Python call at all, both refuse exactly the same operators of the dispatcher, and a
malformed table is an ``ExternNodeError`` naming the node and the field, never a crash."""

from __future__ import annotations

import contextlib
import ctypes
import json

import pytest
import torch

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.shims import (
    AotiModel,
    default_context,
    extern_ops,
    last_error,
    memory_stats,
    proxy_native,
)
from etmetal.shims.abi_codes import DEVICE_CPU
from etmetal.shims.proxy_executor import ExternNodeError, ProxyExecutor, _resolve
from etmetal.testing.proxy_models import MODELS, shift_scale
from etmetal.testing.shim_counts import steady_runs

SHIM = proxy_native.PROXY_SHIM


@pytest.fixture
def no_leaks():
    yield
    stats = memory_stats()
    assert (stats.tensors, stats.storages, stats.bytes) == (0, 0, 0), stats


def _compiled(name: str, target: str = "host"):
    torch.manual_seed(0)
    make, inputs = MODELS[name]
    module, example = make().eval(), inputs()
    art = compile_exported_program(torch.export.export(module, example), target=target)
    assert art.extern_nodes_path is not None  # the .so does call the proxy executor
    return module, art


def _runs(art, inputs, shims: str, runs: int = 3, device: str = "cpu"):
    """Outputs of the first run, of the last, and the per-shim counts of the steady runs."""
    with AotiModel(
        art.so_path, art.weights_path.read_bytes(), extern_nodes=art.extern_nodes_bytes(),
        shims=shims, device=device,
    ) as model:  # fmt: skip
        return steady_runs(model, inputs, runs)


@pytest.mark.parametrize("target", ["host", "mps_emulated"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_are_bit_identical_on_both_executors_and_a_native_run_never_reaches_python(
    name, target, no_leaks
):
    """On the host and on the emulated Metal device (whose proxy results are device 13
    records, as the Python executor's are mps tensors)."""
    module, art = _compiled(name, target)
    inputs = MODELS[name][1]()
    device = "mps" if target == "mps_emulated" else "cpu"
    native_first, native_last, native = _runs(art, inputs, "native", device=device)
    python_first, python_last, python = _runs(art, inputs, "python", device=device)
    for a, b, c in zip(native_first, python_first, native_last):
        assert torch.equal(a, b) and torch.equal(a, c)
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for got, ref in zip(native_first, want):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # the same shims as often on both; natively every call, the proxy's too, stays in C
    assert {n: sum(c) for n, c in native.items()} == {n: sum(c) for n, c in python.items()}
    assert native[SHIM][0] > 0 and sum(p for _, p in native.values()) == 0, native
    assert python[SHIM] == (0, native[SHIM][0])  # the reference runs every one in Python


def test_the_python_executor_serves_a_model_loaded_on_the_python_implementation(no_leaks):
    _, art = _compiled("upsampler")
    x = MODELS["upsampler"][1]()
    calls = proxy_native.calls()
    with AotiModel(
        art.so_path, art.weights_path.read_bytes(), extern_nodes=art.extern_nodes_bytes(),
        shims="python",
    ) as model:  # fmt: skip
        model.run(list(x))
        assert model.proxy_executor.calls == 2
    assert proxy_native.calls() == calls


# -- the allow-list: one description, two implementations -------------------------------


def _python_refusal(target: str) -> str:
    try:
        _resolve(target, f"extern node 0 ({target})")
    except ExternNodeError as exc:
        return str(exc)
    return ""


def _targets() -> list[str]:
    names = set(torch._C._dispatch_get_all_op_names())
    # and the operators only the JIT registry has (torch.ops resolves names there too)
    for schema in torch._C._jit_get_all_schemas():
        names.add(f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name)
    names = sorted(names)
    # and names the dispatcher does not have: default spelled out, malformed, dunders
    odd = [f"{n}.default" for n in names[:: max(len(names) // 200, 1)]]
    odd += ["aten::__init__", "aten::relu.", "nonamespace", "1x::y", "aten::relu.__x", "a::b::c"]
    return names + odd


def test_both_executors_refuse_the_same_operators_of_the_dispatcher():
    targets = _targets()
    disagreements = [
        (t, py, nat)
        for t in targets
        if (py := _python_refusal(t)) != (nat := proxy_native.refusal(t))
    ]
    assert disagreements == []
    accepted = sum(not _python_refusal(t) for t in targets)
    # both sides of the rules are exercised: most ATen operators pass, internals do not
    assert 1000 < accepted < len(targets) - 300, accepted
    assert proxy_native.refusal("etmtest_native::halves") == ""  # testing.proxy_models


def test_an_explicit_allowance_reaches_the_native_executor():
    denied = "aten::manual_seed"
    assert "allow-list" in proxy_native.refusal(denied)
    extern_ops.allow_extern_operator(denied)
    try:
        assert proxy_native.refusal(denied) == _python_refusal(denied) == ""
    finally:
        extern_ops.disallow_extern_operator(denied)
    assert proxy_native.refusal(denied) == _python_refusal(denied) != ""


def test_the_rules_table_is_generated_from_extern_ops():
    from etmetal.shims import proxy_rules

    header = proxy_rules.generate()
    for name in (*extern_ops.TORCH_NAMESPACES, *extern_ops.DENIED_ATEN):
        assert json.dumps(name) in header
    assert json.dumps(extern_ops.DENIED_ATEN_PATTERN.pattern) in header
    assert json.dumps(extern_ops.REASON_NOT_DEFINED_HERE) in header


# -- malformed tables ------------------------------------------------------------------


def _node(target="etmtest_native::shift_scale", inputs=None, outputs=None, metadata=None):
    if inputs is None:
        inputs = [
            {"name": "x", "arg": {"as_tensor": {"name": "a"}}},
            {"name": "w", "arg": {"as_tensor": {"name": "b"}}},
            {"name": "k", "arg": {"as_int": 1}},
            {"name": "alpha", "arg": {"as_float": 0.5}},
        ]
    node = {
        "target": target,
        "inputs": inputs,
        "outputs": [{"as_tensor": {"name": "c"}}] if outputs is None else outputs,
    }
    if metadata is not None:
        node["metadata"] = metadata
    return {"name": "buf", "node": node}


def _second(**fields) -> str:
    """A table whose node 0 is fine and node 1 is built from ``fields``."""
    return json.dumps({"nodes": [_node(), _node(**fields)]})


MALFORMED = [
    (_second(inputs=5), ["extern node 1", "'inputs'", "not an array"]),
    (_second(outputs={"x": 1}), ["extern node 1", "'outputs'"]),
    (_second(target=7), ["extern node 1", "target"]),
    (_second(target="etmtest_native::nope"), ["extern node 1", "not registered"]),
    (_second(inputs=[{"name": "zz", "arg": {"as_int": 1}}]), ["extern node 1", "'zz'", "schema"]),
    (
        _second(inputs=[{"name": "x", "arg": {"as_tensor": {"name": "a"}}}]),
        ["extern node 1", "no value for argument 'w'"],
    ),
    (
        _second(inputs=[{"name": "x", "arg": {"as_tensor": 3}}]),
        ["extern node 1", "input 0 (x)", "not an object"],
    ),
    (
        _second(inputs=[{"name": "k", "arg": {"as_ints": "abc"}}]),
        ["extern node 1", "input 0 (k)", "as_ints"],
    ),
    (
        _second(inputs=[{"name": "k", "arg": {"as_sym_float": 1.0}}]),
        ["extern node 1", "'as_sym_float' is not supported"],
    ),
    (_second(outputs=[]), ["extern node 1", "0 serialized outputs"]),
    (
        _second(outputs=[{"as_tensor": {"name": "c"}, "as_int": 3}]),
        ["extern node 1", "output 0", "exactly one kind"],
    ),
    (
        _second(metadata={"etmetal_tensor_dtypes": '{"a": "__class__"}'}),
        ["extern node 1", "tensor 'a'", "not a torch dtype"],
    ),
    (
        _second(metadata={"etmetal_tensor_dtypes": "{not json"}),
        ["extern node 1", "etmetal_tensor_dtypes", "not JSON"],
    ),
    (_second(metadata=[1]), ["extern node 1", "metadata"]),
    ('{"nodes": [1]}', ["extern node 0", "not a serialized extern kernel node"]),
    ('{"nodes": {"a": 1}}', ["'nodes' is not a list"]),
    ("not json", ["not valid JSON", "at byte 0"]),
    ('{"nodes": []} trailing', ["not valid JSON", "trailing"]),
    ('{"nodes": ' + "[" * 200_000 + "]" * 200_000 + "}", ["nested too deeply"]),
    ('{"nodes": "\\ud800\\', ["not valid JSON"]),
    ('{"nodes": [1, 2', ["not valid JSON", "unterminated"]),
    (b"\xff\xfe{", ["not valid JSON"]),
]


@pytest.mark.parametrize("table, mentions", MALFORMED)
def test_a_malformed_table_is_an_error_naming_the_node_and_field(table, mentions):
    with pytest.raises(ExternNodeError) as info:
        proxy_native.NativeProxyExecutor(table)
    for words in mentions:
        assert words in str(info.value), str(info.value)
    # the reference refuses every one of them too (its words may differ)
    with pytest.raises(ExternNodeError):
        ProxyExecutor.from_json(table, DEVICE_CPU)


def test_a_sound_table_parses_to_its_nodes():
    assert proxy_native.NativeProxyExecutor(_second()).nodes == 2


# -- a call through the bridge: served in C, or by the reference when it must fail -------

TABLE = json.dumps(
    {
        "nodes": [
            _node(
                outputs=[{"as_tensor": {"name": "c"}}],
                metadata={
                    "etmetal_tensor_dtypes": json.dumps(
                        {"a": "float32", "b": "float32", "c": "float32"}
                    )
                },
            )
        ]
    }
)


@pytest.fixture
def served():
    """A proxy handle both executors serve (the native one first)."""
    ctx = default_context()
    bridge = ctx.load_bridge()
    handle = ctx.register_proxy_executor(ProxyExecutor.from_json(TABLE, DEVICE_CPU))
    native = proxy_native.NativeProxyExecutor(TABLE)
    bridge.serve_proxy(handle, native)
    yield handle
    bridge.serve_proxy(handle, None)
    native.close()
    ctx.unregister_proxy_executor(handle)


def _handles(*hs):
    return (ctypes.c_void_p * len(hs))(*hs)


def test_a_call_is_served_in_c_and_a_wrong_dtype_is_named_by_the_reference(cdrv, served):
    counts = default_context().bridge.shim_counts
    x, w = torch.randn(1, 3, 2, 2), torch.randn(3)
    hx, hw = cdrv.from_torch(x), cdrv.from_torch(w)
    out = ctypes.c_void_p()
    assert cdrv.lib.aoti_torch_new_uninitialized_tensor(ctypes.byref(out)) == 0
    before = counts().get(SHIM, (0, 0))
    rc = cdrv.lib.aoti_torch_proxy_executor_call_function(
        served, 0, 1, cdrv.i64s([4]), 3, _handles(hx, hw, out.value)
    )
    assert rc == 0, last_error()
    after = counts()[SHIM]
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)  # in C
    torch.testing.assert_close(
        torch.from_numpy(cdrv.read(out.value)), shift_scale(x, w, 4, 0.5), atol=0, rtol=0
    )
    hi = cdrv.empty((1, 3, 2, 2), dtype=4)  # int64
    cdrv.expect_failure(
        SHIM, served, 0, 1, cdrv.i64s([4]), 3, _handles(hi, hw, out.value), mentions="dtype"
    )
    cdrv.expect_failure(  # counts the reference checks: the native path leaves them to it
        SHIM, served, 0, 0, None, 3, _handles(hx, hw, out.value), mentions="int(s)"
    )
    for h in (hx, hw, hi, out.value):
        assert cdrv.delete(h) == 0


def test_mutated_tables_are_errors_or_tables_never_crashes():
    """Random byte flips, cuts and splices of a real table: the native parser returns a
    table or an ExternNodeError, and when the reference accepts a mutant the native
    executor reads the same number of nodes, or names what it refuses."""
    import random

    _, art = _compiled("upsampler")
    table = art.extern_nodes_bytes()
    rng = random.Random(25)
    outcomes = {"parsed": 0, "refused": 0}
    for _ in range(400):
        data = bytearray(table)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.5:
                data[pos] = rng.randrange(256)
            elif choice < 0.75:
                del data[pos : pos + rng.randint(1, 20)]
            else:
                data[pos:pos] = rng.choice([b"[", b"{", b'"', b"1e999", b"null", b"\\u0000"])
        try:
            native = proxy_native.NativeProxyExecutor(bytes(data))
        except ExternNodeError as exc:
            outcomes["refused"] += 1
            assert "extern" in str(exc), str(exc)
            continue
        outcomes["parsed"] += 1
        nodes = native.nodes
        native.close()
        # the reference may refuse a mutant the native parser reads (it is stricter in
        # places, laxer in others); when both read it, they read the same nodes
        with contextlib.suppress(ExternNodeError):
            assert len(ProxyExecutor.from_json(bytes(data), DEVICE_CPU).nodes) == nodes
    assert outcomes["refused"] > 100, outcomes
