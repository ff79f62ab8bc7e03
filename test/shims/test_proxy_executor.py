"""The proxy executor driven exactly as a compiled ``.so`` drives it: an extern-node table
in Inductor's format, the flattened int and tensor-handle arrays, output handles from
``aoti_torch_new_uninitialized_tensor``; results against eager PyTorch, bad input against
readable error codes."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest
import torch

from etmetal.shims import default_context, last_error
from etmetal.shims.abi_codes import DEVICE_CPU
from etmetal.shims.proxy_executor import ExternNodeError, ProxyExecutor

SHIM = "aoti_torch_proxy_executor_call_function"


@torch.library.custom_op("etmtest_proxy::affine", mutates_args=())
def affine(x: torch.Tensor, w: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    return x * alpha + w + k


@torch.library.custom_op("etmtest_proxy::scale_into", mutates_args=("out",))
def scale_into(out: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
    out.copy_(x * alpha)


def _tensor(name: str) -> dict:
    return {"as_tensor": {"name": name}}


def _node(target: str, inputs: list, outputs: list, dtypes: dict) -> dict:
    return {
        "name": "buf",
        "node": {
            "target": target,
            "inputs": [{"name": n, "arg": a, "kind": 1} for n, a in inputs],
            "outputs": outputs,
            "metadata": {"etmetal_tensor_dtypes": json.dumps(dtypes)},
        },
    }


TABLE = json.dumps(
    {
        "nodes": [
            _node(
                "etmtest_proxy::affine",
                [
                    ("x", _tensor("buf0")),
                    ("w", _tensor("buf1")),
                    ("k", {"as_int": 3}),
                    ("alpha", {"as_float": 0.5}),
                ],  # fmt: skip
                [_tensor("buf2")],
                {"buf0": "float32", "buf1": "float32", "buf2": "float32"},
            ),
            _node(
                "aten::_upsample_bilinear2d_aa",
                [
                    ("self", _tensor("arg0_1")),
                    ("output_size", {"as_ints": [8, 10]}),
                    ("align_corners", {"as_bool": False}),
                    ("scales_h", {"as_float": 2.0}),
                    ("scales_w", {"as_float": 2.0}),
                ],  # fmt: skip
                [_tensor("buf3")],
                {"arg0_1": "float32", "buf3": "float32"},
            ),
            _node(
                "etmtest_proxy::scale_into",
                [("out", _tensor("buf4")), ("x", _tensor("buf5")), ("alpha", {"as_float": 3.0})],
                [],
                {"buf4": "float32", "buf5": "float32"},
            ),
            _node(
                "aten::add_.Tensor",
                [("self", _tensor("buf6")), ("other", _tensor("buf7"))],
                [_tensor("buf6")],
                {"buf6": "float32", "buf7": "float32"},
            ),
        ]
    }
)


@pytest.fixture
def proxy():
    ctx = default_context()
    handle = ctx.register_proxy_executor(ProxyExecutor.from_json(TABLE, DEVICE_CPU))
    yield handle
    ctx.unregister_proxy_executor(handle)


def _handles(*hs: int) -> ctypes.Array:
    return (ctypes.c_void_p * max(len(hs), 1))(*hs)


def _uninitialized(cdrv) -> int:
    h = ctypes.c_void_p()
    assert cdrv.lib.aoti_torch_new_uninitialized_tensor(ctypes.byref(h)) == 0, last_error()
    return h.value


def _t(cdrv, h) -> torch.Tensor:
    return torch.from_numpy(cdrv.read(h))


def test_custom_op_result_fills_the_output_handle(cdrv, proxy):
    x, w = torch.randn(2, 3), torch.randn(3)
    hx, hw, out = cdrv.from_torch(x), cdrv.from_torch(w), _uninitialized(cdrv)
    rc = cdrv.lib.aoti_torch_proxy_executor_call_function(
        proxy, 0, 1, cdrv.i64s([4]), 3, _handles(hx, hw, out)
    )
    assert rc == 0, last_error()
    # the int comes from the flattened array (4), the float from the table (0.5)
    torch.testing.assert_close(_t(cdrv, out), x * 0.5 + w + 4)
    assert cdrv.geometry(out)[0] == (2, 3)
    for h in (hx, hw, out):
        assert cdrv.delete(h) == 0


def test_aten_op_without_c_shim_matches_eager(cdrv, proxy):
    x = torch.randn(1, 3, 4, 5)
    hx, out = cdrv.from_torch(x), _uninitialized(cdrv)
    rc = cdrv.lib.aoti_torch_proxy_executor_call_function(
        proxy, 1, 2, cdrv.i64s([8, 10]), 2, _handles(hx, out)
    )
    assert rc == 0, last_error()
    want = torch.nn.functional.interpolate(x, size=(8, 10), mode="bilinear", antialias=True)
    torch.testing.assert_close(_t(cdrv, out), want)
    for h in (hx, out):
        assert cdrv.delete(h) == 0


def test_mutated_argument_is_written_in_place_through_a_strided_view(cdrv, proxy):
    base = cdrv.empty((4, 6))
    cdrv.write(base, np.zeros((4, 6), np.float32))
    rc, view = cdrv.reinterpret(base, (4, 3), (6, 2), 1)  # every other column from 1
    assert rc == 0, last_error()
    x = torch.randn(4, 3)
    hx = cdrv.from_torch(x)
    rc = cdrv.lib.aoti_torch_proxy_executor_call_function(proxy, 2, 0, None, 2, _handles(view, hx))
    assert rc == 0, last_error()
    want = torch.zeros(4, 6)
    want[:, 1::2] = x * 3.0
    torch.testing.assert_close(_t(cdrv, base), want)
    for h in (view, hx, base):
        assert cdrv.delete(h) == 0


def test_unknown_node_index_is_an_error_naming_it(cdrv, proxy):
    hx = cdrv.from_torch(torch.randn(2))
    for index in (4, 99, -1):
        msg = cdrv.expect_failure(
            SHIM, proxy, index, 0, None, 1, _handles(hx), mentions=f"extern node index {index}"
        )
        assert "has 4 node(s)" in msg
    assert cdrv.delete(hx) == 0


def test_argument_counts_that_disagree_with_the_schema_are_errors(cdrv, proxy):
    hx, hw, out = cdrv.from_torch(torch.randn(3)), cdrv.from_torch(torch.randn(3)), 0
    out = _uninitialized(cdrv)
    msg = cdrv.expect_failure(
        SHIM, proxy, 0, 0, None, 3, _handles(hx, hw, out), mentions="extern node 0"
    )
    assert "etmtest_proxy::affine(" in msg and "takes 1 int(s) and 3 tensor(s)" in msg
    msg = cdrv.expect_failure(
        SHIM, proxy, 0, 1, cdrv.i64s([1]), 2, _handles(hx, hw), mentions="got 1 int(s) and 2"
    )
    # the output handle was left alone: still the empty placeholder
    assert cdrv.geometry(out)[0] == (0,)
    for h in (hx, hw, out):
        assert cdrv.delete(h) == 0


def test_tensor_of_the_wrong_dtype_is_an_error_naming_the_dtypes(cdrv, proxy):
    hx = cdrv.empty((2, 3), dtype=4)  # int64
    hw, out = cdrv.from_torch(torch.randn(3)), _uninitialized(cdrv)
    msg = cdrv.expect_failure(
        SHIM, proxy, 0, 1, cdrv.i64s([1]), 3, _handles(hx, hw, out), mentions="dtype torch.int64"
    )
    assert "tensor 0 (buf0)" in msg and "expects torch.float32" in msg
    for h in (hx, hw, out):
        assert cdrv.delete(h) == 0


def test_bad_handles_and_a_missing_executor_are_errors(cdrv, proxy):
    hx = cdrv.from_torch(torch.randn(3))
    cdrv.expect_failure(
        SHIM, None, 0, 1, cdrv.i64s([1]), 3, _handles(hx, hx, hx), mentions="proxy_executor"
    )
    cdrv.expect_failure(
        SHIM, 0xBAD0, 0, 1, cdrv.i64s([1]), 3, _handles(hx, hx, hx), mentions="not a live proxy"
    )
    cdrv.expect_failure(
        SHIM, proxy, 0, 1, cdrv.i64s([1]), 3, _handles(hx, 0xBAD0, hx), mentions="not a live"
    )
    cdrv.expect_failure(SHIM, proxy, 0, 1, cdrv.i64s([1]), 3, None, mentions="NULL")
    assert cdrv.delete(hx) == 0


@pytest.mark.parametrize(
    "table, mentions",
    [
        ("not json", "not valid JSON"),
        (
            '{"nodes": [{"node": {"target": "etmtest_proxy::nope", "inputs": [], "outputs": []}}]}',
            "not registered in this process",
        ),  # fmt: skip
        (
            '{"nodes": [{"node": {"target": "etmtest_proxy::affine", "inputs": '
            '[{"name": "zz", "arg": {"as_int": 1}}], "outputs": []}}]}',
            "does not match the schema",
        ),  # fmt: skip
    ],
)
def test_malformed_tables_are_refused_at_load(table, mentions):
    with pytest.raises(ExternNodeError, match=mentions):
        ProxyExecutor.from_json(table, DEVICE_CPU)


def test_in_place_op_returning_its_argument_keeps_the_handle_on_its_view(cdrv, proxy):
    base = cdrv.empty((2, 4))
    cdrv.write(base, np.ones((2, 4), np.float32))
    rc, view = cdrv.reinterpret(base, (2, 2), (4, 1), 2)  # the right half
    assert rc == 0, last_error()
    other = torch.randn(2, 2)
    ho = cdrv.from_torch(other)
    before = cdrv.ptr(view)
    rc = cdrv.lib.aoti_torch_proxy_executor_call_function(
        proxy, 3, 0, None, 3, _handles(view, ho, view)
    )
    assert rc == 0, last_error()
    assert cdrv.ptr(view) == before  # still a view into base, not a copy
    want = torch.ones(2, 4)
    want[:, 2:] += other
    torch.testing.assert_close(_t(cdrv, base), want)
    for h in (view, ho, base):
        assert cdrv.delete(h) == 0


# -- the allow-list and hostile tables ---------------------------------------------------


def _table(target, inputs=(), outputs=()) -> str:
    node = {"target": target, "inputs": list(inputs), "outputs": list(outputs)}
    return json.dumps({"nodes": [{"name": "buf", "node": node}]})


def _from_file_table(path: str) -> str:
    return _table(
        "aten::from_file",
        [
            {"name": "filename", "arg": {"as_string": path}},
            {"name": "shared", "arg": {"as_bool": True}},
            {"name": "size", "arg": {"as_int": 4}},
        ],
        [_tensor("buf0")],
    )


def test_a_table_naming_from_file_is_refused_and_creates_no_file(tmp_path):
    target = tmp_path / "planted"
    with pytest.raises(ExternNodeError, match=r"aten::from_file is not on the proxy executor"):
        ProxyExecutor.from_json(_from_file_table(str(target)), DEVICE_CPU)
    assert not target.exists()
    # the reference: torch's operator with the table's arguments would have created it
    torch.ops.aten.from_file(str(target), shared=True, size=4)
    assert target.stat().st_size == 16


@pytest.mark.parametrize(
    "target, mentions",
    [
        ("aten::save", "not on the proxy executor's allow-list"),
        ("aten::set_.source_Storage", "not on the proxy executor's allow-list"),
        ("aten::manual_seed", "not on the proxy executor's allow-list"),
        ("aten::_unsafe_index.Tensor", "not on the proxy executor's allow-list"),
        ("aten::as_strided_", "not on the proxy executor's allow-list"),
        ("inductor::_reinterpret_tensor", "torch internals"),
        ("debugprims::load_tensor", "torch internals"),
        ("prims::as_strided", "torch internals"),
        ("__class__::__init__.__call__", "of identifiers"),
        ("aten::__getattribute__", "of identifiers"),
        ("nowhere_ns::op", "not registered in this process"),
        ("", "of identifiers"),
        (7, "not a string"),
    ],
)
def test_operators_outside_the_allow_list_are_extern_node_errors(target, mentions):
    with pytest.raises(ExternNodeError, match=mentions):
        ProxyExecutor.from_json(_table(target), DEVICE_CPU)


def test_an_operator_allowed_explicitly_is_accepted():
    from etmetal.shims import extern_ops

    table = _table("aten::manual_seed", [{"name": "seed", "arg": {"as_int": 1}}])
    extern_ops.allow_extern_operator("aten::manual_seed")
    try:
        [node] = ProxyExecutor.from_json(table, DEVICE_CPU).nodes
        assert node.op is torch.ops.aten.manual_seed.default
    finally:
        extern_ops.disallow_extern_operator("aten::manual_seed")
    with pytest.raises(ExternNodeError):
        ProxyExecutor.from_json(table, DEVICE_CPU)


@pytest.mark.parametrize(
    "table",
    [
        '{"nodes": ' + "[" * 200_000 + "]" * 200_000 + "}",
        '{"nodes": [{"node": {"target": "aten::add.Tensor", "inputs": [' + "[" * 100_000
        + "]" * 100_000 + '], "outputs": []}}]}',
        '{"nodes": [[1]]}',
        '{"nodes": [{"node": {"target": "aten::add.Tensor", "inputs": [5], "outputs": []}}]}',
        '{"nodes": [{"node": {"target": "aten::add.Tensor", "inputs": [], "outputs": [7]}}]}',
        '{"nodes": [{"node": {"target": "etmtest_proxy::affine", "inputs": [{"name": "x", '
        '"arg": {"as_tensor": 3}}], "outputs": []}}]}',
        '{"nodes": [{"node": {"target": "etmtest_proxy::affine", "inputs": [{"name": "x", '
        '"arg": {"as_tensor": {"name": "a"}}}], "outputs": [{"as_tensor": {"name": "b"}}], '
        '"metadata": {"etmetal_tensor_dtypes": "{\\"a\\": \\"__class__\\"}"}}}]}',
        b"\xff\xfe{",
        '{"nodes": {"a": 1}}',
    ],
)  # fmt: skip
def test_hostile_tables_are_extern_node_errors_not_foreign_exceptions(table):
    with pytest.raises(ExternNodeError):
        ProxyExecutor.from_json(table, DEVICE_CPU)
