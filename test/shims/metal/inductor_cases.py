"""The modules whose Inductor-generated Metal kernels the MSL tests run (shared by the test and
by ``make_inductor_kernels.py``, which regenerates ``inductor_kernels.json``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# name -> (function, input shapes); every input is float32 from a seeded generator.
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
}


def inputs(name: str, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in CASES[name][1]]
