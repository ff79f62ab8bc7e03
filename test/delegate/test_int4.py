"""The registry's int4 modules (torchao fpa4w) through the host delegate: the result is
torchao's reference path computed from the float weights with torchao's own quantizer,
and the weights stay packed in the program and at run time."""

from __future__ import annotations

import pytest
import torch

from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.shims import load_bridge
from etmetal.testing.pte_blobs import metal_delegates, named_bytes
from etmetal.testing.torchao_reference import int4_linear_reference

INT4 = [name for name, entry in REGISTRY.items() if entry.qlinear == "fpa4w"]
SHIM = "aoti_torch_cpu__linear_fp_act_4bit_weight"


def test_the_registry_has_the_five_upstream_int4_linears():
    assert sorted(INT4) == sorted(
        [
            "linear_nobias_int4",
            "linear_bias_int4",
            "linear_int4_qmv_impl",
            "linear_int4_qmv_impl_small_odd",
            "linear_int4_qmv_impl_small_even",
        ]
    )


@pytest.mark.parametrize("name", INT4)
def test_int4_delegate_matches_torchao_reference(name, lowered):
    low = lowered(f"registry:{name}", lambda: get_model_and_inputs(name))
    float_module, _ = get_model_and_inputs(name, quantize=False)
    group_size = REGISTRY[name].qlinear_group_size
    for seed in (0, 1):
        x = low.inputs[0] if seed == 0 else torch.randn(low.inputs[0].shape)
        [got] = low.execute([x])
        want = int4_linear_reference(float_module.linear, x, group_size)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # and the quantization is real: the float module's output differs
    assert not torch.allclose(float_module(x), want, atol=1e-4, rtol=1e-4)


def test_int4_weights_stay_packed_in_the_program_and_at_run_time(lowered):
    name = "linear_bias_int4"
    low = lowered(f"registry:{name}", lambda: get_model_and_inputs(name))
    linear = low.module.linear
    n, k = 256, 128
    packed = linear.packed_weights.detach()
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (n, k // 2)

    # the program stores the packed bytes, not a float matrix (in the shared layout of a
    # host program for etmetal's runtime: one named-data entry per constant)
    [delegate] = metal_delegates(low.pte)
    assert delegate.layout == "shared"
    [packed_entry] = [c for c in delegate.index if c["fqn"].endswith("packed_weights")]
    packed_bytes = packed.numpy().tobytes()
    assert delegate.constants[packed_entry["key"]][: len(packed_bytes)] == packed_bytes
    stored = sum(len(v) for k, v in named_bytes(low.pte).items() if not k.endswith("_so_blob"))
    assert stored < n * k  # less than one byte per weight: no float copy beside it

    # at run time the shim reads the uint8 constant where the program's named data holds it:
    # the Python shim (the reference, spied on) is handed a borrowed uint8 view...
    seen = []
    bridge = load_bridge()
    ctx = bridge.context
    original = ctx.shims[SHIM]

    def spy(ctx, a, b, group_size, s, z, ret):
        t = ctx.lookup(b, "B")
        seen.append((t.torch().dtype, tuple(t.sizes), t.storage.owned, group_size))
        return original(ctx, a, b, group_size, s, z, ret)

    bridge.bind(SHIM, spy)
    previous = ctx.set_implementation("python")
    try:
        (reference,) = low.execute(low.inputs)
    finally:
        ctx.set_implementation(previous)
        bridge.bind(SHIM, original)
    assert seen == [(torch.uint8, (n, k // 2), False, 32)]
    # ... and the native implementation serves the same call in C, with the same bits
    before = bridge.shim_counts().get(SHIM, (0, 0))
    (native,) = low.execute(low.inputs)
    after = bridge.shim_counts()[SHIM]
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0) and not seen[1:]
    assert torch.equal(native, reference)
