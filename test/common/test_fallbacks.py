"""One fallback table: the partitioner allows exactly the fallbacks the shims implement,
and every name in it is a C-shim torch declares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from etmetal.backend.mps_abi import MPS_RUNTIME_ABI
from etmetal.backend.supported_ops import SUPPORTED_FALLBACKS
from etmetal.backend.targets import TARGETS
from etmetal.common.custom_ops import CUSTOM_OP_SHIMS
from etmetal.common.fallback_table import (
    FALLBACKS,
    PROXY_EXECUTOR_SHIM,
    RUNTIMES,
    all_fallback_shims,
    etmetal_fallback_shims,
    fallback_shims,
    runtime_shims,
)
from etmetal.shims import default_context

# every shim the default context implements (standard shims and the emulated Metal device)
SHIMS = default_context().shims

_FALLBACK_SYMBOL = re.compile(r"aoti_torch_(?:cpu|mps|cuda|xpu)_")


def _declared(device: str) -> set[str]:
    """The C-shim fallbacks torch's own headers declare for ``device`` (the generated
    ``c_shim_<device>.h`` and the hand-written ``c/shim_<device>.h``)."""
    root = Path(torch.__file__).parent / "include/torch/csrc/inductor/aoti_torch"
    headers = [root / f"generated/c_shim_{device}.h", root / f"c/shim_{device}.h"]
    text = "".join(h.read_text() for h in headers if h.exists())
    return set(re.findall(rf"\b(aoti_torch_{device}_\w+)\(", text))


def test_every_target_has_a_row():
    assert set(FALLBACKS) == set(TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_every_fallback_the_partitioner_allows_has_a_shim(target):
    allowed = SUPPORTED_FALLBACKS[target]
    assert allowed == fallback_shims(target)
    assert sorted(allowed - set(SHIMS)) == []


def test_every_fallback_shim_is_in_the_table():
    # the Metal device runtime (shim_mps.h: memory, libraries, dispatch) shares the prefix
    # but is no operator fallback (test_mps_emulated_target checks that list against torch)
    shims = {n for n in SHIMS if _FALLBACK_SYMBOL.match(n) and n not in MPS_RUNTIME_ABI}
    assert shims, "no fallback shims registered"
    assert sorted(shims - set(all_fallback_shims())) == []


@pytest.mark.parametrize("target", TARGETS)
def test_every_table_entry_is_a_shim_torch_declares(target):
    # custom operators' shims are declared by their owners (torchao, ExecuTorch's Metal
    # ops), which etmetal's custom-op table restates for the C bridge and for Inductor
    device, _ = FALLBACKS[target]
    custom = {s.symbol(device) for s in CUSTOM_OP_SHIMS}
    assert sorted(fallback_shims(target) - _declared(device) - custom) == []


@pytest.mark.parametrize("target", TARGETS)
def test_every_etmetal_runtime_fallback_is_a_shim_torch_declares(target):
    # the bridge builds each trampoline from torch's declaration of that symbol
    device, _ = FALLBACKS[target]
    extra = etmetal_fallback_shims(target)
    assert sorted(extra - _declared(device)) == []
    assert extra <= runtime_shims(target, "etmetal")
    # the target's own runtime does not get them
    assert not extra & runtime_shims(target, "upstream")


def test_the_emulated_device_adds_every_scan_for_the_etmetal_runtime():
    # Inductor's mps code has no scan kernels: each scan lowering falls back to its C shim
    scans = {"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"}
    assert {f"aoti_torch_mps_{op}" for op in scans} <= etmetal_fallback_shims("mps_emulated")
    assert not {f"aoti_torch_mps_{op}" for op in scans} & runtime_shims("mps_emulated", "upstream")


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("target", TARGETS)
def test_every_fallback_a_runtime_is_allowed_has_a_shim(target, runtime):
    allowed = runtime_shims(target, runtime)
    assert allowed >= fallback_shims(target)
    assert (PROXY_EXECUTOR_SHIM in allowed) == (runtime == "etmetal")
    assert sorted(allowed - set(SHIMS)) == []


def test_custom_op_shims_are_upstreams():
    """The mps declarations are the ones torchao and ExecuTorch hand to Inductor."""
    from executorch.backends.apple.metal.ops.gated_delta_rule import (
        metal_gated_delta_rule_c_shim,
    )
    from executorch.backends.apple.metal.ops.gather_qmv import metal_gather_qmv_c_shim

    from etmetal.backend import torchao_ops

    torchao_ops.register()
    from torchao.experimental.ops.mps.cshim import torchao_op_c_shim

    upstream = {
        op._schema.name: decls
        for table in (metal_gather_qmv_c_shim, metal_gated_delta_rule_c_shim, torchao_op_c_shim)
        for op, decls in table.items()
    }
    for shim in CUSTOM_OP_SHIMS:
        assert upstream[shim.qualname] == [shim.declaration("mps")]
    for target in TARGETS:
        assert {s.op_name for s in CUSTOM_OP_SHIMS} <= FALLBACKS[target][1]
