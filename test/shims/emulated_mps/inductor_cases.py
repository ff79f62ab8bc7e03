"""The modules whose Inductor-generated Metal kernels the MSL tests run (shared by the test and
by ``make_inductor_kernels.py``, which regenerates ``inductor_kernels.json``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# name -> (function, inputs): a shape (float32) or (shape, dtype), from a seeded generator.
CASES = {
    "elementwise": (lambda x, y: torch.sigmoid(x) * y + torch.exp(-x.abs()), [(37, 53), (37, 53)]),
    "broadcast": (lambda x, y: torch.tanh(x + y) / (1 + y * y), [(31, 67), (67,)]),
    "softmax": (lambda x: torch.softmax(x, -1), [(5, 1500)]),
    "softmax_small": (lambda x: torch.softmax(x, -1), [(7, 100)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (1200,), w, b), [(3, 1200), (1200,), (1200,)]),
    "layer_norm_small": (lambda x, w, b: F.layer_norm(x, (96,), w, b), [(13, 96), (96,), (96,)]),
    "sum_dim0": (lambda x: x.sum(0), [(1100, 9)]),
    "amax_dim0": (lambda x: x.amax(0), [(1300, 5)]),
    "argmax": (lambda x: x.argmax(-1), [(6, 1111)]),
    "argmax_small": (lambda x: x.argmax(-1), [(6, 50)]),
    "var_mean": (lambda x: torch.var_mean(x, -1), [(4, 2000)]),
    "gelu_erf": (lambda x: F.gelu(x) + F.silu(x), [(33, 65)]),
    "rms_norm": (
        lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
        [(9, 1100), (1100,)],
    ),
    "int_math": (
        lambda x: (torch.floor_divide(x * 7, 3) + torch.remainder(x, 5) * x).clamp(-50, 50),
        [((41, 29), torch.int32)],
    ),
    "where_pow": (
        lambda x, y: torch.where(x > 0, x.pow(1.7), y.abs().sqrt()) + torch.atan2(x, y),
        [(23, 47), (23, 47)],
    ),
    "log_softmax_dim0": (lambda x: torch.log_softmax(x, 0), [(1030, 3)]),
    "half_softmax": (lambda x: torch.softmax(x, -1), [((6, 1200), torch.float16)]),
    "bf16_ops": (
        lambda x, y: (x * y + x.exp()).sum(-1),
        [((7, 300), torch.bfloat16), ((7, 300), torch.bfloat16)],
    ),
    "min_int64": (lambda x: x.amin(-1), [((8, 1500), torch.int64)]),
}


def specs(name: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    return [
        (s[0], s[1]) if len(s) == 2 and isinstance(s[1], torch.dtype) else (tuple(s), torch.float32)
        for s in CASES[name][1]
    ]


def inputs(name: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape, dtype in specs(name):
        if dtype.is_floating_point:
            out.append(torch.randn(*shape, generator=g).to(dtype))
        else:
            out.append(torch.randint(-1000, 1000, shape, generator=g, dtype=dtype))
    return out
