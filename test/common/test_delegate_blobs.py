"""The processed bytes of a Metal delegate: two keys (upstream's layout), or three when the
partition carries an extern-node table for etmetal's proxy executor."""

from __future__ import annotations

import pytest

from etmetal.common.delegate_blobs import (
    EXTERN_NODES_SUFFIX,
    SO_SUFFIX,
    WEIGHTS_SUFFIX,
    blob_key,
    extern_nodes_key,
    format_processed,
    key_digest,
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
