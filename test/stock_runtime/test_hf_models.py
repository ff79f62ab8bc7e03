"""The suite's small-config Hugging Face models (``etmetal.testing.hf_models``), lowered for
``host``, run by the stock ExecuTorch runtime through etmetal's native MetalBackend and
match eager PyTorch: in etmetal's shared-weights layout and in the layout the ``metal_stock``
flow lowers for (``runtime="upstream"``: one weights blob per partition, no proxy executor).

Outside code: transformers' position ids (a cumsum over a mask), rotary embeddings,
grouped-query attention, masks, a speech encoder's convolutions; each a whole model in
one delegate, each executed three times on one loaded method.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock
from etmetal.testing.hf_models import (
    EAGER_ATTENTION_MODELS,
    MODELS,
    VOCAB,
    build,
    build_eager_attention,
)
from etmetal.testing.pte_blobs import metal_delegates

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_matches  # noqa: E402

# the tolerance the delegate tests hold these models to on etmetal's runtime
ATOL = RTOL = 1e-4
NAMES = sorted(MODELS) + sorted(EAGER_ATTENTION_MODELS)
LAYOUTS = {"etmetal": "shared", "upstream": "one_blob"}  # lowering runtime -> weights layout


def _make(name: str, runtime: str):
    model, inputs = build(name) if name in MODELS else build_eager_attention(name)
    return model, inputs, {"runtime": runtime}


def _fresh(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Other values with the example input's shape: token ids or audio samples."""
    gen = torch.Generator().manual_seed(seed)
    if x.dtype.is_floating_point:
        return torch.randn(x.shape, generator=gen, dtype=x.dtype)
    return torch.randint(0, VOCAB, x.shape, generator=gen, dtype=x.dtype)


@pytest.mark.parametrize("runtime", sorted(LAYOUTS))
@pytest.mark.parametrize("name", NAMES)
def test_small_hf_model_matches_eager_in_the_stock_runtime(name, runtime, stock_lowered, trusted):
    low = stock_lowered(f"hf:{name}:{runtime}", lambda: _make(name, runtime))
    report = low.partitioner.reports[-1]
    assert not report.kept_out, report.text()
    assert len(report.partitions) == 1, report.text()
    [delegate] = metal_delegates(low.pte)
    assert delegate.layout == LAYOUTS[runtime]
    assert delegate.extern_nodes_key is None  # nothing for the (Python-only) proxy executor

    program = Runtime.get().load_program(low.pte)
    method = program.load_method("forward")
    assert stock.native_counts()["delegates"] == 1  # the delegate is etmetal's, natively
    for seed in (0, 1, 2):  # one method, three executes: nothing carries over between them
        inputs = low.inputs if seed == 0 else tuple(_fresh(x, seed) for x in low.inputs)
        with torch.no_grad():
            expected = low.module(*inputs)
        got = [t.clone() for t in method.execute(list(inputs))]
        assert_matches(got, expected, ATOL, RTOL)
    del method, program
    gc.collect()
    counts = stock.native_counts()  # the delegate, its records and constants went with it
    assert (counts["delegates"], counts["live"], counts["stores"]) == (0, 0, 0), counts


# -- on the emulated Metal device ----------------------------------------------------------
# every model above, lowered for mps_emulated with runtime="etmetal" (the emulated device's
# shims serve the scans a Mac's runtime lacks, so each is one delegate): Inductor's Metal
# kernels and the mps fallbacks (attention, convolution), in the stock runtime


@pytest.mark.parametrize("name", NAMES)
def test_small_hf_model_on_mps_emulated_matches_eager_in_the_stock_runtime(
    name, stock_lowered, trusted
):
    def make():
        model, inputs = build(name) if name in MODELS else build_eager_attention(name)
        return model, inputs, {"target": "mps_emulated", "runtime": "etmetal"}

    low = stock_lowered(f"hf:{name}:mps_emulated", make)
    report = low.partitioner.reports[-1]
    assert report.target == "mps_emulated"
    assert not report.kept_out, report.text()
    assert len(report.partitions) == 1, report.text()
    program = Runtime.get().load_program(low.pte)
    method = program.load_method("forward")
    assert stock.native_counts()["delegates"] == 1
    for seed in (0, 1, 2):
        inputs = low.inputs if seed == 0 else tuple(_fresh(x, seed) for x in low.inputs)
        with torch.no_grad():
            expected = low.module(*inputs)
        got = [t.clone() for t in method.execute(list(inputs))]
        assert_matches(got, expected, ATOL, RTOL)
    del method, program
    gc.collect()
    counts = stock.native_counts()
    assert (counts["delegates"], counts["live"], counts["mps_storages"]) == (0, 0, 0), counts
