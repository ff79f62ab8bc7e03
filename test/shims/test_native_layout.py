"""The structs shared by C and Python (``native_tensors.h``) agree field by field.

``etm_layout`` is the C compiler's ``sizeof``/``offsetof`` of every struct and field of
the header (and its constants); the ctypes mirrors in ``native_tensors`` are Python's. The
bridge refuses to load when they differ; these tests check that both tables are complete
and equal, and that a drift on either side is caught and named.
"""

from __future__ import annotations

import ctypes

import pytest

from etmetal.shims import native_tensors as nt
from etmetal.shims.model_link import WARNINGS, build_files
from etmetal.shims.native_tensors import LayoutError, check_layout, native_layout, python_layout


def _layout_lib(header: bytes) -> ctypes.CDLL:
    """native_tensors.cpp built alone against ``header``."""
    files = {
        nt.SOURCE.name: nt.SOURCE.read_bytes(),
        nt.HEADER.name: header,
        nt.RECORDS_HEADER.name: nt.RECORDS_HEADER.read_bytes(),
    }
    path = build_files(
        "test-layout",
        "liblayout.so",
        files,
        [nt.SOURCE.name],
        lang="c++",
        flags=("-O0", "-std=c++17", *WARNINGS),
    )
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)


@pytest.fixture(scope="module")
def lib():
    return _layout_lib(nt.HEADER.read_bytes())


def test_every_struct_field_has_the_same_size_and_offset_on_both_sides(lib):
    c, py = native_layout(lib), python_layout()
    expected_names = set(nt.CONSTANTS)
    for name, cls in nt.STRUCTS.items():
        expected_names.add(name)
        expected_names.update(f"{name}.{field}" for field, _ in cls._fields_)
    assert set(c) == expected_names  # C exports every field Python mirrors, and no other
    assert set(py) == expected_names
    for name in sorted(expected_names):
        assert c[name] == py[name], name
    check_layout(lib)


def test_the_loaded_bridge_passed_the_check():
    from etmetal.shims import load_bridge

    lib = load_bridge().lib
    assert native_layout(lib) == python_layout()
    assert native_layout(lib)["etm_rec"][0] == nt.RECORD_SIZE


def test_a_python_mirror_that_drifts_is_named(lib, monkeypatch):
    class ShortOut(ctypes.Structure):  # etm_out with its sizes one dim short
        _fields_ = [
            (n, ctypes.c_int64 * (nt.MAX_DIMS - 1) if n == "sizes" else t)
            for n, t in nt.OutSpec._fields_
        ]

    monkeypatch.setitem(nt.STRUCTS, "etm_out", ShortOut)
    with pytest.raises(LayoutError, match=r"etm_out\.sizes.*etm_out\.strides"):
        check_layout(lib)


def test_a_header_that_drifts_is_named():
    header = nt.HEADER.read_bytes()
    assert b"#define ETM_MAX_DIMS 8 " in header
    drifted = _layout_lib(header.replace(b"#define ETM_MAX_DIMS 8 ", b"#define ETM_MAX_DIMS 6 "))
    with pytest.raises(LayoutError) as err:
        check_layout(drifted)
    for name in ("ETM_MAX_DIMS", "etm_rec.sizes", "etm_rec.native", "etm_out.strides"):
        assert name in str(err.value)
