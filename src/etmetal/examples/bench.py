"""The benchmark models: an MLP, a MobileNet-like CNN, a small transformer, a tiny model.

Each ``BenchModel`` gives a module in eval mode and example inputs. ``scale``
shrinks every size so smoke tests run in seconds; ``scale=1`` is the issue's size
(MLP 3 x Linear 1024 batch 32; CNN channels-last 1x3x224x224; transformer
4 layers, d_model 512, sequence 128, batch 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class BenchModel:
    name: str
    description: str
    make_module: Callable[[], nn.Module]
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]


class Mlp(nn.Module):
    def __init__(self, width: int = 1024, layers: int = 3) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        for i in range(layers):
            mods.append(nn.Linear(width, width))
            if i < layers - 1:
                mods.append(nn.ReLU())
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _conv_bn_relu(cin: int, cout: int, stride: int, groups: int = 1) -> nn.Sequential:
    k = 3 if groups > 1 or cin == 3 else 1
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(),
    )


class MobileNetLike(nn.Module):
    """A stem conv and depthwise-separable blocks (MobileNet v1 shape), pooled to logits."""

    def __init__(self, width: int = 32, classes: int = 1000) -> None:
        super().__init__()
        # (output channels as a multiple of width, stride of the depthwise conv)
        plan = [(2, 1), (4, 2), (4, 1), (8, 2), (8, 1), (16, 2), (16, 1), (32, 2)]
        layers: list[nn.Module] = [_conv_bn_relu(3, width, 2)]
        c = width
        for mult, stride in plan:
            layers.append(_conv_bn_relu(c, c, stride, groups=c))  # depthwise 3x3
            layers.append(_conv_bn_relu(c, mult * width, 1))  # pointwise 1x1
            c = mult * width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.head(x.mean(dim=(2, 3)))

    def fold_batch_norm(self) -> MobileNetLike:
        """Fold each eval-mode batch norm into its convolution, as a deployment export does."""
        from torch.nn.utils.fusion import fuse_conv_bn_eval

        for block in self.features:
            conv, bn = block[0], block[1]
            block[0], block[1] = fuse_conv_bn_eval(conv, bn), nn.Identity()
        return self


class Transformer(nn.Module):
    """Pre-norm encoder layers (multi-head attention + GELU MLP), written out so they export."""

    def __init__(self, d_model: int = 512, layers: int = 4, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.blocks = nn.ModuleList(_Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) * self.head_dim**-0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Tiny(nn.Module):
    """A few elementwise ops on a small tensor: its latency is all call overhead."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)


def _seeded(make: Callable[[], nn.Module], fold: bool = False) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        module = make().eval()
        for m in module.modules():  # non-trivial batch-norm statistics
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        return module.fold_batch_norm() if fold else module

    return build


def _inputs(*shape: int, channels_last: bool = False) -> Callable[[], tuple[torch.Tensor, ...]]:
    def make() -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(*shape, generator=g)
        return (x.to(memory_format=torch.channels_last) if channels_last else x,)

    return make


def models(scale: int = 1) -> dict[str, BenchModel]:
    """The models by name; ``scale`` > 1 divides widths and sizes (smoke tests)."""
    s = max(1, int(scale))
    mlp_w, res, d_model, seq = 1024 // s, max(32, 224 // s), max(32, 512 // s), max(8, 128 // s)
    cnn_w = max(4, 32 // s)
    return {
        "tiny": BenchModel("tiny", "relu(2x+1) on 1x16", _seeded(Tiny), _inputs(1, 16)),
        "mlp": BenchModel(
            "mlp",
            f"3 x Linear {mlp_w}, batch 32",
            _seeded(lambda: Mlp(mlp_w)),
            _inputs(32, mlp_w),
        ),
        "cnn": BenchModel(
            "cnn",
            f"MobileNet-like (batch norm folded), channels-last 1x3x{res}x{res}",
            _seeded(lambda: MobileNetLike(cnn_w, 1000 // s), fold=True),
            _inputs(1, 3, res, res, channels_last=True),
        ),
        "transformer": BenchModel(
            "transformer",
            f"4-layer transformer, d_model {d_model}, seq {seq}, batch 1",
            _seeded(lambda: Transformer(d_model, 4, 8)),
            _inputs(1, seq, d_model),
        ),
    }
