"""The 28 float32 modules of ExecuTorch's Metal test registry.

Same operator patterns as upstream's ``backends/apple/metal/tests/test_modules.py``
(add, mm, addmm, split+cat, linear, conv1d, the SDPA variants with their stride
layouts, narrow on the last dim, topk, the int4 linears, ``metal::gather_qmv`` and
``metal::gated_delta_rule``) and the same float32 tolerances, with smaller shapes so
that every module compiles in seconds; the strided SDPA variants keep upstream's layouts
(a [B, S, H, D] buffer viewed as [B, H, S, D], broadcast queries, an additive mask)
scaled down.

The int4 modules (``qlinear="fpa4w"``) are quantized the way upstream quantizes them:
torchao's ``UIntxWeightOnlyConfig(bitwidth=4)`` through ``quantize_``, whose operators
etmetal registers where torchao's MPS library is missing
(:mod:`etmetal.backend.torchao_ops`). Their eager output is torchao's reference
(dequantize by group, then matmul), which upstream compares with
(``compare_to_unquantized: False``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-5


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    make_module: Callable[[], nn.Module]
    input_shapes: tuple[tuple[int, ...], ...]
    description: str
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    qlinear: str | None = None  # "fpa4w": int4 weights, float activations (torchao)
    qlinear_group_size: int = 32


class Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class Mm(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, y)


class MmWeightParam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-1.0, 1.0, 20).reshape(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.weight)


class Addmm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(5))
        self.weight = nn.Parameter(torch.randn(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight)


class SplitCat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second, third = x.split(2, dim=1)  # split_copy in edge dialect
        return torch.cat([first * 2.0, second + 1.0, third], dim=1)


class Linear(nn.Module):
    def __init__(self, bias: bool, in_features: int = 7, out_features: int = 101) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Conv1d(nn.Module):
    def __init__(self, cin: int, cout: int, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel_size=3, stride=1, padding=1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Sdpa(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)


class SdpaAdd(nn.Module):
    """Q, K, V are parameters; the input is added to the attention output."""

    def __init__(self, shape: tuple[int, ...] = (2, 4, 16, 64)) -> None:
        super().__init__()
        self.q = nn.Parameter(torch.randn(shape))
        self.k = nn.Parameter(torch.randn(shape))
        self.v = nn.Parameter(torch.randn(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.scaled_dot_product_attention(self.q, self.k, self.v, dropout_p=0.0)
        return out + x


class StridedSdpa(nn.Module):
    """Q, K, V parameters seen through ``as_strided`` layouts, scale 1, optional mask."""

    def __init__(
        self,
        sizes: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
        strides: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
        mask_size: tuple[int, ...] | None = None,
        is_causal: bool = False,
    ) -> None:
        super().__init__()
        self.sizes, self.strides = sizes, strides
        self.mask_size, self.is_causal = mask_size, is_causal
        self.q = nn.Parameter(torch.randn(sizes[0]))
        self.k = nn.Parameter(torch.randn(sizes[1]))
        self.v = nn.Parameter(torch.randn(sizes[2]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            torch.as_strided(p, size=s, stride=st)
            for p, s, st in zip((self.q, self.k, self.v), self.sizes, self.strides)
        )
        mask = torch.zeros(self.mask_size) if self.mask_size else None
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, mask, dropout_p=0.0, is_causal=self.is_causal, scale=1.0
        )
        return out + x


class NarrowLastDim(nn.Module):
    """Two halves of the last dim as non-packed views, combined."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x.narrow(-1, 0, half) * 2.0 + x.narrow(-1, half, half)


class TopK(nn.Module):
    """Expert routing: scores from a linear layer, the two best per row."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, _ = torch.topk(self.linear(x), 2, dim=-1)
        return values


class GatherQmv(nn.Module):
    """``metal::gather_qmv``: each row times the int4 weights of its expert (MoE)."""

    def __init__(self, experts: int = 4, n: int = 64, k: int = 128, group_size: int = 32):
        super().__init__()
        from executorch.backends.apple.metal.ops.gather_qmv import _quantize_int4_affine

        packed, scales, biases = _quantize_int4_affine(torch.randn(experts, n, k), group_size)
        self.register_buffer("w", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("biases", biases)
        self.group_size, self.experts = group_size, experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        indices = torch.arange(x.shape[0], dtype=torch.int32) % self.experts
        return torch.ops.metal.gather_qmv(
            x, self.w, self.scales, self.biases, indices, self.group_size
        )


class GatedDeltaRule(nn.Module):
    """``metal::gated_delta_rule`` over a state buffer reset at every call (as upstream)."""

    def __init__(self, batch: int = 1, heads: int = 4, dv: int = 64, dk: int = 64) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(batch, heads, dv, dk))

    def forward(self, q, k, v, g, beta) -> torch.Tensor:
        self.state.zero_()
        return torch.ops.metal.gated_delta_rule(q, k, v, g, beta, self.state)


def _bshd(b: int, h: int, s: int, d: int) -> tuple[int, ...]:
    """Strides of a [B, S, H, D] buffer viewed as [B, H, S, D]."""
    return (s * h * d, d, h * d, 1)


def _contiguous(b: int, h: int, s: int, d: int) -> tuple[int, ...]:
    return (h * s * d, s * d, d, 1)


_ENTRIES = [
    RegistryEntry("add", Add, ((10,), (10,)), "elementwise addition"),
    RegistryEntry("mm", Mm, ((3, 4), (4, 5)), "matrix product of two inputs"),
    RegistryEntry("mm_weight_param", MmWeightParam, ((3, 4),), "mm with a weight parameter"),
    RegistryEntry("addmm", Addmm, ((1, 4),), "raw addmm with batch 1"),
    RegistryEntry("split_cat", SplitCat, ((1, 6, 4),), "split along channels, then concat"),
    RegistryEntry("linear_nobias", lambda: Linear(False), ((127, 7),), "linear without bias"),
    RegistryEntry("linear_bias", lambda: Linear(True), ((127, 7),), "linear with bias"),
    RegistryEntry(
        "linear_bias_batch1", lambda: Linear(True), ((1, 7),), "linear with bias, batch 1"
    ),
    RegistryEntry(
        "conv1d_nobias", lambda: Conv1d(8, 6, False), ((1, 8, 5),), "conv1d 8->6, no bias"
    ),
    RegistryEntry(
        "conv1d_bias", lambda: Conv1d(16, 48, True), ((1, 16, 64),), "conv1d 16->48 with bias"
    ),
    RegistryEntry(
        "conv1d_voxtral",
        lambda: Conv1d(16, 64, False),
        ((2, 16, 48),),
        "conv1d with a batch of 2 (Voxtral's audio stem, scaled down)",
    ),
    RegistryEntry("sdpa", Sdpa, ((2, 4, 16, 64),) * 3, "scaled dot-product attention"),
    RegistryEntry("sdpa_add", SdpaAdd, ((2, 4, 16, 64),), "SDPA of parameters plus the input"),
    RegistryEntry(
        "sdpa_strided",
        lambda: StridedSdpa(((2, 3, 24, 16),) * 3, (_bshd(2, 3, 24, 16),) * 3),
        ((2, 3, 24, 16),),
        "SDPA over [B, S, H, D] buffers viewed as [B, H, S, D]",
        atol=1e-4,
    ),
    RegistryEntry(
        "sdpa_strided_broadcast",
        lambda: StridedSdpa(
            ((1, 3, 1, 16), (1, 3, 24, 16), (1, 3, 24, 16)),
            (_bshd(1, 3, 1, 16), _bshd(1, 3, 24, 16), _bshd(1, 3, 24, 16)),
        ),
        ((1, 3, 1, 16),),
        "one query row against strided keys (Whisper decoder step)",
    ),
    RegistryEntry(
        "sdpa_strided_broadcast_attn_mask",
        lambda: StridedSdpa(
            ((1, 3, 1, 16), (1, 3, 32, 16), (1, 3, 32, 16)),
            (_bshd(1, 3, 1, 16), _contiguous(1, 3, 32, 16), _contiguous(1, 3, 32, 16)),
            mask_size=(1, 1, 1, 32),
        ),
        ((1, 3, 1, 16),),
        "one query row with an additive mask (Whisper decoder step, cached keys)",
    ),
    RegistryEntry(
        "sdpa_contiguous_causal",
        lambda: StridedSdpa(((1, 4, 24, 16),) * 3, (_contiguous(1, 4, 24, 16),) * 3, None, True),
        ((1, 4, 24, 16),),
        "causal SDPA over contiguous parameters",
        atol=1e-4,
    ),
    RegistryEntry(
        "sdpa_strided_causal",
        lambda: StridedSdpa(((1, 4, 24, 16),) * 3, (_bshd(1, 4, 24, 16),) * 3, None, True),
        ((1, 4, 24, 16),),
        "causal SDPA over strided parameters",
        atol=1e-4,
    ),
    RegistryEntry(
        "sdpa_head_dim_256", Sdpa, ((1, 4, 8, 256),) * 3, "SDPA with head_dim 256", atol=1e-4
    ),
    RegistryEntry("narrow_last_dim", NarrowLastDim, ((2, 4, 16),), "narrow halves of the last dim"),
    RegistryEntry("topk", TopK, ((4, 64),), "top-2 routing over linear scores"),
    *(
        RegistryEntry(
            name,
            make,
            shapes,
            description + " (int4 weights, torchao fpa4w, group size 32)",
            atol=5e-2,
            rtol=5e-2,
            qlinear="fpa4w",
        )
        for name, make, shapes, description in (
            ("linear_nobias_int4", lambda: Linear(False, 128, 256), ((127, 128),), "linear"),
            ("linear_bias_int4", lambda: Linear(True, 128, 256), ((127, 128),), "linear + bias"),
            # one row: upstream's qmv kernel; N = 2 (mod 4) like upstream's 8198
            ("linear_int4_qmv_impl", lambda: Linear(True, 640, 1030), ((1, 640),), "one row"),
            ("linear_int4_qmv_impl_small_odd", lambda: Linear(True, 32, 3), ((1, 32),), "N=3"),
            ("linear_int4_qmv_impl_small_even", lambda: Linear(True, 32, 10), ((1, 32),), "N=10"),
        )
    ),
    RegistryEntry(
        "gather_qmv",
        GatherQmv,
        ((4, 128),),
        "expert-indexed int4 matmul (metal::gather_qmv)",
        atol=5e-2,
        rtol=5e-2,
    ),
    RegistryEntry(
        "gated_delta_rule",
        GatedDeltaRule,
        ((1, 2, 4, 64), (1, 2, 4, 64), (1, 2, 4, 64), (1, 2, 4), (1, 2, 4)),
        "gated delta rule recurrence (metal::gated_delta_rule)",
        atol=1e-4,
    ),
]

REGISTRY: dict[str, RegistryEntry] = {e.name: e for e in _ENTRIES}


def get_model_and_inputs(
    name: str, seed: int = 0, quantize: bool = True
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A fresh module in eval mode and random float32 inputs, both from ``seed``.
    ``quantize=False``: the int4 modules' float original (same weights, not quantized)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown registry module {name!r}; choose from {', '.join(REGISTRY)}")
    entry = REGISTRY[name]
    gen = torch.Generator().manual_seed(seed)
    _register_custom_ops()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = entry.make_module().eval()
    if entry.qlinear is not None and quantize:
        quantize_linears(module, entry.qlinear, entry.qlinear_group_size)
    inputs = tuple(torch.randn(*s, generator=gen) for s in entry.input_shapes)
    return module, inputs


def _register_custom_ops() -> None:
    """The operators the int4 and custom-op modules call (torchao's low-bit ops where its
    MPS library is missing, ExecuTorch's ``metal::`` reference ops)."""
    import executorch.backends.apple.metal.ops.gated_delta_rule  # noqa: F401
    import executorch.backends.apple.metal.ops.gather_qmv  # noqa: F401

    from etmetal.backend.torchao_ops import register

    register()


def quantize_linears(module: nn.Module, qlinear: str, group_size: int = 32) -> None:
    """Quantize every ``nn.Linear`` of ``module`` in place, as upstream's registry does."""
    if qlinear != "fpa4w":
        raise ValueError(f"unsupported linear quantization {qlinear!r}; expected 'fpa4w'")
    from torchao.experimental.quant_api import UIntxWeightOnlyConfig
    from torchao.quantization.quant_api import quantize_

    def linears(m: nn.Module, fqn: str) -> bool:
        if not isinstance(m, nn.Linear):
            return False
        if m.weight.shape[1] % group_size:
            raise ValueError(
                f"int4 quantization of {fqn}: K={m.weight.shape[1]} is not a multiple of the "
                f"group size {group_size}"
            )
        return True

    _register_custom_ops()
    quantize_(module, UIntxWeightOnlyConfig(group_size=group_size, bitwidth=4), filter_fn=linears)
