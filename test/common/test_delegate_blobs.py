"""The processed bytes of a Metal delegate: the .so's key, the constants' key (upstream's
weights blob or the shared layout's weights index) and, when the partition carries an
extern-node table for etmetal's proxy executor, a third key."""

from __future__ import annotations

import pytest

from etmetal.common.delegate_blobs import (
    EXTERN_NODES_SUFFIX,
    INDEX_SUFFIX,
    SO_SUFFIX,
    WEIGHTS_SUFFIX,
    blob_key,
    extern_nodes_key,
    format_processed,
    key_digest,
    parse_keys,
    parse_processed,
)

SO, WEIGHTS = blob_key(b"so", SO_SUFFIX), blob_key(b"w", WEIGHTS_SUFFIX)


def test_two_keys_stay_upstreams_layout():
    processed = format_processed(SO, WEIGHTS)
    assert processed == f"{SO}\n{WEIGHTS}".encode()
    assert parse_processed(processed) == (SO, WEIGHTS)
    assert extern_nodes_key(processed) is None


def test_a_third_key_names_the_extern_node_table():
    table = blob_key(b'{"nodes": []}', EXTERN_NODES_SUFFIX)
    assert key_digest(table) and table.endswith(EXTERN_NODES_SUFFIX)
    processed = format_processed(SO, WEIGHTS, table)
    assert parse_processed(processed) == (SO, WEIGHTS)
    assert extern_nodes_key(processed) == table


@pytest.mark.parametrize(
    "third",
    [blob_key(b"x", "_other_blob"), "nothex" + EXTERN_NODES_SUFFIX, ""],
)
def test_a_malformed_third_line_is_refused(third):
    processed = f"{SO}\n{WEIGHTS}\n{third}".encode()
    with pytest.raises(ValueError, match="not a Metal AOTI blob reference"):
        extern_nodes_key(processed)
    with pytest.raises(ValueError, match="not a Metal AOTI blob reference"):
        parse_processed(processed + b"\n" + processed)


def test_a_weights_index_and_an_extern_node_table_together():
    index = blob_key(b'{"format": "etmetal-weights-index/1"}', INDEX_SUFFIX)
    table = blob_key(b'{"nodes": []}', EXTERN_NODES_SUFFIX)
    for third in (None, table):
        keys = parse_keys(format_processed(SO, index, third))
        assert (keys.so, keys.weights, keys.extern_nodes) == (SO, index, third)
        assert keys.shared_weights
    assert not parse_keys(format_processed(SO, WEIGHTS, table)).shared_weights


@pytest.mark.parametrize(
    "lines",
    [
        [SO, blob_key(b"t", EXTERN_NODES_SUFFIX)],  # the table where the constants go
        [SO, blob_key(b"i", INDEX_SUFFIX), blob_key(b"w", WEIGHTS_SUFFIX)],  # two constants
        [blob_key(b"i", INDEX_SUFFIX), SO],  # swapped
    ],
)
def test_keys_out_of_place_are_refused(lines):
    with pytest.raises(ValueError, match="not a Metal AOTI blob reference"):
        parse_keys("\n".join(lines).encode())


def test_key_digest_is_the_leading_sha256_whatever_follows():
    digest = "ab" * 32
    # a shared constant's key carries its FQN, underscores and dots included
    assert key_digest(f"{digest}_model.layers.0.attn_q.weight_weight") == digest
    assert key_digest(f"{digest}_so_blob") == digest
    assert key_digest(f"{digest}so_blob") == ""  # no separator
    assert key_digest(f"{digest[:-1]}_so_blob") == ""  # 63 digits
    assert key_digest(f"{digest.upper()}_so_blob") == ""  # hashlib writes lower case


def test_delegate_digest_changes_with_every_input_and_does_not_splice():
    from etmetal.common.delegate_blobs import delegate_digest

    processed = b"a" * 64 + b"_so_blob\n" + b"b" * 64 + b"_weights_blob"
    base = delegate_digest(processed, [("target", b"host")])
    assert len(base) == 64 and base == delegate_digest(processed, [("target", b"host")])
    others = {
        delegate_digest(processed + b"\n" + b"c" * 64 + b"_externs_blob", [("target", b"host")]),
        delegate_digest(processed, [("target", b"mps_emulated")]),
        delegate_digest(processed, []),
        delegate_digest(processed, [("target", b"host"), ("share_weights", b"0")]),
        delegate_digest(processed, [("targe", b"thost")]),  # length-prefixed: no splicing
        delegate_digest(processed[:-1], [("target", b"phost")]),
    }
    assert base not in others and len(others) == 6
    # not the .so digest nor a plain sha256 of the processed bytes: a different domain
    import hashlib

    assert base != hashlib.sha256(processed).hexdigest()
