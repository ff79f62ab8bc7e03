"""A partition whose wrapper's constant table cannot be read keeps upstream's one weights
blob (``split_weights`` gives None) instead of failing the lowering."""

from __future__ import annotations

from etmetal.backend.weights_split import split_weights

BLOB = bytes(range(16))


def test_no_constant_table_keeps_one_blob():
    assert split_weights("// a wrapper without constants_info_\n", BLOB, set(), False) is None


def test_a_table_with_a_gap_in_its_indices_keeps_one_blob():
    wrapper = (
        '  constants_info_[0].name = "w";\n'
        "  constants_info_[0].dtype = cached_torch_dtype_float32;\n"
        '  constants_info_[2].name = "b";\n'
        "  constants_info_[2].dtype = cached_torch_dtype_float32;\n"
    )
    assert split_weights(wrapper, BLOB, set(), False) is None


def test_an_unknown_dtype_keeps_one_blob():
    wrapper = '  constants_info_[0].name = "w";\n  constants_info_[0].dtype = some_dtype;\n'
    assert split_weights(wrapper, BLOB, set(), False) is None
