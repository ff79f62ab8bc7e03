"""Seeded random layout programs: small CNN-like graphs that mix channels-last and default
dim orders the way real models do, for property tests of a lowering on the stock runtime.

A program is a list of steps over a 4-D activation (N, C, H, W), then a head. The steps
cover convolutions (regular, depthwise, 1x1, strided; channels-last or default weights),
pooling, views anywhere (channel splits, flatten/unflatten, a rank-3 round trip),
permute/transpose, softmax over any dim, cat/chunk/split along C and spatial dims,
elementwise ops on mixed layouts and with broadcasting, normalizations and explicit layout
changes; heads are a linear layer (over the flattened map, the pooled channels or
per-position tokens) or none. Inputs are batch 1 or 2, C = 1 or more, channels-last or
contiguous.

Everything follows from ``(seed, index)``: the structure from a ``random.Random``, the
weights and inputs from ``torch.manual_seed``, so a failing program is reproduced by its
name alone (``generated_program(seed, index)``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

CL = torch.channels_last

Shape = tuple[int, int, int, int]


@dataclass(frozen=True)
class Step:
    """One operation: ``kind`` and its parameters (plain data, for names and repr)."""

    kind: str
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def __str__(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in self.params if k != "shape")
        return f"{self.kind}({args})" if args else self.kind


def _step(kind: str, **params: Any) -> Step:
    return Step(kind, tuple(params.items()))


def one_pass_layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """Layer norm with the variance taken as E[x^2] - E[x]^2, the arithmetic of ExecuTorch's
    portable ``native_layer_norm`` kernel (eager takes it around the mean). When the mean
    is large against the spread of a short row, that difference cancels and float32 loses
    digits eager keeps: this reference says how many (``layout_property``)."""
    n = x.shape[-1]
    mean = x.sum(-1, keepdim=True) / n
    variance = (x * x).sum(-1, keepdim=True) / n - mean * mean
    return (x - mean) / torch.sqrt(variance + norm.eps) * norm.weight + norm.bias


class LayoutProgram(nn.Module):
    """Runs the steps of a generated program; submodules are made when built."""

    def __init__(self, steps: list[Step], shape: Shape, portable_layer_norm: bool = False) -> None:
        super().__init__()
        self.steps = steps
        self.portable_layer_norm = portable_layer_norm
        self.layers = nn.ModuleDict()
        self.params = nn.ParameterDict()
        n, c, h, w = shape
        for index, step in enumerate(steps):
            key = str(index)
            kind = step.kind
            if kind == "conv":
                conv = nn.Conv2d(
                    c,
                    step.get("out"),
                    step.get("k"),
                    stride=step.get("stride"),
                    padding=step.get("k") // 2,
                    groups=step.get("groups"),
                    bias=step.get("bias"),
                )
                if step.get("weight_cl"):
                    conv.weight.data = conv.weight.data.to(memory_format=CL)
                self.layers[key] = conv
            elif kind == "cat" and step.get("branch") == "conv1x1":
                self.layers[key] = nn.Conv2d(c, c, 1)
            elif kind == "add_bias":
                self.params[key] = nn.Parameter(torch.randn(c, 1, 1))
            elif kind == "add_vector":
                self.params[key] = nn.Parameter(torch.randn(w))
            elif kind == "batch_norm":
                norm = nn.BatchNorm2d(c)
                norm.running_mean.normal_()
                norm.running_var.uniform_(0.5, 2.0)
                norm.weight.data.normal_()
                norm.bias.data.normal_()
                self.layers[key] = norm
            elif kind == "group_norm":
                self.layers[key] = nn.GroupNorm(step.get("groups"), c)
            elif kind == "layer_norm":
                self.layers[key] = nn.LayerNorm(w)
            elif kind.startswith("head_"):
                self.layers[key] = nn.Linear(step.get("features"), step.get("classes"))
            n, c, h, w = step.get("shape", (n, c, h, w))

    def forward(self, x: torch.Tensor) -> Any:
        for index, step in enumerate(self.steps):
            x = self.run_step(str(index), step, x)
        return x

    def run_step(self, key: str, step: Step, x: torch.Tensor) -> Any:
        """One step. (Not ``_apply``: that name is ``nn.Module``'s own, which ``.double()``
        and ``.to()`` call; shadowing it broke them.)"""
        kind, get = step.kind, step.get
        n, c, h, w = x.shape if x.dim() == 4 else (0, 0, 0, 0)
        if kind == "layer_norm" and self.portable_layer_norm:
            return one_pass_layer_norm(self.layers[key], x)
        if kind in ("conv", "batch_norm", "group_norm", "layer_norm"):
            return self.layers[key](x)
        if kind == "relu":
            return torch.relu(x)
        if kind == "hardtanh":
            return torch.nn.functional.hardtanh(x, -0.5, 0.5)
        if kind == "max_pool":
            return torch.nn.functional.max_pool2d(x, 2)
        if kind == "avg_pool":
            return torch.nn.functional.avg_pool2d(x, 2)
        if kind == "global_pool":
            return torch.nn.functional.adaptive_avg_pool2d(x, 1)
        if kind == "channel_split":
            return x.reshape(n, c // 2, 2 * h, w)
        if kind == "spatial_to_channels":
            return x.reshape(n, 2 * c, h // 2, w)
        if kind == "flatten_unflatten":
            y = x.flatten(2)
            if get("mid") == "relu":
                y = torch.relu(y)
            return y.unflatten(2, (h, w))
        if kind == "rank3_softmax":
            return torch.softmax(x.reshape(n, c, h * w), dim=get("dim")).reshape(n, c, h, w)
        if kind == "transpose":
            return x.transpose(get("a"), get("b"))
        if kind == "permute":
            return x.permute(*get("dims"))
        if kind == "softmax":
            return torch.softmax(x, dim=get("dim"))
        if kind == "cat":
            other = self.layers[key](x) if get("branch") == "conv1x1" else torch.relu(x)
            return torch.cat([x, other], dim=get("dim"))
        if kind == "chunk":
            a, b = x.chunk(2, dim=get("dim"))
            if get("join") == "cat":
                return torch.cat([b, a], dim=get("dim"))
            return a * torch.sigmoid(b)
        if kind == "split":
            dim = get("dim")
            a, b = x.split([1, x.shape[dim] - 1], dim=dim)
            return torch.cat([b, a * 2.0], dim=dim)
        if kind == "add_mixed":
            return x + x.contiguous() * 0.5 if get("first") == "x" else x.contiguous() + x
        if kind == "add_layouts":
            return x.to(memory_format=CL) - x.contiguous() * 0.25
        if kind == "add_bias":
            return x + self.params[key]
        if kind == "add_vector":
            return x * self.params[key]
        if kind == "add_scalar":
            return x * 0.5 + 1.0
        if kind == "add_pooled":
            return x - x.mean(dim=(2, 3), keepdim=True)
        if kind == "gate":
            return x * torch.sigmoid(x.mean(dim=(2, 3), keepdim=True))
        if kind == "to_contiguous":
            return x.contiguous()
        if kind == "to_channels_last":
            return x.to(memory_format=CL)
        if kind == "head_flatten":
            return self.layers[key](x.flatten(1))
        if kind == "head_pool":
            return self.layers[key](x.mean(dim=(2, 3)))
        if kind == "head_tokens":
            return self.layers[key](x.flatten(2).transpose(1, 2))
        if kind == "two_outputs":
            return x, x.sum(dim=1, keepdim=True)
        raise ValueError(f"unknown step kind {kind!r}")


@dataclass
class GeneratedProgram:
    """One generated program, with the interface the view-copy regression drives
    (``name``, ``module()``, ``example_inputs()``, ``run_inputs()``, ``export()``)."""

    name: str
    seed: int
    steps: list[Step]
    input_shape: Shape
    input_channels_last: bool
    dynamic_shapes: Any = None
    description: str = field(default="")
    # float64: the same program (same float32-drawn values, widened), for telling rounding
    # from a layout bug (see ``layout_property``)
    dtype: torch.dtype = torch.float32

    def module(self, portable_layer_norm: bool = False) -> nn.Module:
        """The program; ``portable_layer_norm``: its layer norms computed the way the
        portable kernel does (:func:`one_pass_layer_norm`), same weights."""
        torch.manual_seed(self.seed)
        program = LayoutProgram(self.steps, self.input_shape, portable_layer_norm)
        return program.eval().to(self.dtype)

    def _input(self, offset: int) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(self.seed + offset)
        x = torch.randn(*self.input_shape).to(self.dtype)
        return (x.to(memory_format=CL) if self.input_channels_last else x,)

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return self._input(1)

    def run_inputs(self) -> tuple[torch.Tensor, ...]:
        return self._input(2)

    def export(self) -> torch.export.ExportedProgram:
        return torch.export.export(self.module(), self.example_inputs())

    @property
    def contiguous(self) -> bool:
        """No channels-last tensor anywhere: the input, every conv weight and every step
        keep the default dim order."""
        return not self.input_channels_last and not any(
            s.get("weight_cl") or s.kind in ("to_channels_last", "add_layouts") for s in self.steps
        )


def _conv_step(rng: random.Random, shape: Shape, contiguous: bool) -> Step:
    n, c, h, w = shape
    variant = rng.choice(["regular", "depthwise", "pointwise", "strided"])
    out, k, stride, groups = rng.choice([1, 2, 4, 8]), 3, 1, 1
    if variant == "depthwise":
        out, groups = c, c
    elif variant == "pointwise":
        k = 1
    elif variant == "strided":
        stride = 2
    new = (n, out, (h - 1) // stride + 1, (w - 1) // stride + 1)
    return _step(
        "conv",
        variant=variant,
        out=out,
        k=k,
        stride=stride,
        groups=groups,
        bias=rng.random() < 0.7,
        weight_cl=(not contiguous) and rng.random() < 0.6,
        shape=new,
    )


def _body_step(rng: random.Random, shape: Shape, contiguous: bool) -> Step | None:
    n, c, h, w = shape
    kind = rng.choice(
        [
            "conv", "conv", "conv", "relu", "hardtanh", "max_pool", "avg_pool", "global_pool",
            "channel_split", "spatial_to_channels", "flatten_unflatten", "rank3_softmax",
            "transpose", "permute", "softmax", "cat", "chunk", "split", "add_mixed",
            "add_layouts", "add_bias", "add_vector", "add_scalar", "add_pooled", "gate",
            "batch_norm", "group_norm", "layer_norm", "to_contiguous", "to_channels_last",
        ]
    )  # fmt: skip
    if kind == "conv":
        return _conv_step(rng, shape, contiguous)
    if kind in ("max_pool", "avg_pool"):
        return _step(kind, shape=(n, c, h // 2, w // 2)) if min(h, w) >= 2 else None
    if kind == "global_pool":
        return _step(kind, shape=(n, c, 1, 1)) if rng.random() < 0.3 else None
    if kind == "channel_split":
        return _step(kind, shape=(n, c // 2, 2 * h, w)) if c % 2 == 0 else None
    if kind == "spatial_to_channels":
        return _step(kind, shape=(n, 2 * c, h // 2, w)) if h % 2 == 0 else None
    if kind == "flatten_unflatten":
        return _step(kind, mid=rng.choice(["none", "relu"]))
    if kind == "rank3_softmax":
        return _step(kind, dim=rng.choice([1, 2]))
    if kind == "transpose":
        a, b = rng.choice([(2, 3), (1, 2), (1, 3)])
        dims = [n, c, h, w]
        dims[a], dims[b] = dims[b], dims[a]
        return _step(kind, a=a, b=b, shape=tuple(dims))
    if kind == "permute":
        order = rng.choice([(0, 1, 3, 2), (0, 2, 3, 1), (0, 3, 1, 2)])
        return _step(kind, dims=order, shape=tuple(shape[d] for d in order))
    if kind == "softmax":
        return _step(kind, dim=rng.choice([1, 2, 3, -1]))
    if kind == "cat":
        dim = rng.choice([1, 2, 3])
        new = list(shape)
        new[dim] *= 2
        return _step(kind, dim=dim, branch=rng.choice(["relu", "conv1x1"]), shape=tuple(new))
    if kind == "chunk":
        dim = rng.choice([1, 2, 3])
        if shape[dim] % 2:
            return None
        join = rng.choice(["cat", "gate"])
        new = list(shape)
        if join == "gate":
            new[dim] //= 2
        return _step(kind, dim=dim, join=join, shape=tuple(new))
    if kind == "split":
        dim = rng.choice([1, 2, 3])
        return _step(kind, dim=dim) if shape[dim] >= 2 else None
    if kind == "add_mixed":
        return _step(kind, first=rng.choice(["x", "contiguous"]))
    if kind in ("add_layouts", "to_channels_last") and contiguous:
        return None
    if kind == "group_norm":
        return _step(kind, groups=rng.choice([g for g in (1, 2) if c % g == 0]))
    return _step(kind)


def _head_step(rng: random.Random, shape: Shape) -> Step | None:
    n, c, h, w = shape
    kind = rng.choice(["head_flatten", "head_pool", "head_tokens", "none", "two_outputs"])
    classes = rng.choice([3, 5])
    if kind == "head_flatten":
        return _step(kind, features=c * h * w, classes=classes) if c * h * w <= 1024 else None
    if kind in ("head_pool", "head_tokens"):
        return _step(kind, features=c, classes=classes)
    return None if kind == "none" else _step(kind)


def generated_program(seed: int, index: int) -> GeneratedProgram:
    """Program ``index`` of the sequence ``seed`` names."""
    rng = random.Random(seed * 1_000_003 + index)
    contiguous = rng.random() < 0.2  # a share of all-default programs (the control)
    shape: Shape = (
        rng.choice([1, 2]),
        rng.choice([1, 3, 4]),
        rng.choice([4, 6, 8]),
        rng.choice([4, 5, 6]),
    )
    input_shape = shape
    steps: list[Step] = []
    # a conv first most of the time, as in real models
    if rng.random() < 0.7:
        steps.append(_conv_step(rng, shape, contiguous))
        shape = steps[-1].get("shape")
    for _ in range(rng.randint(1, 5)):
        step = _body_step(rng, shape, contiguous)
        if step is None or max(step.get("shape", shape)) > 32:
            continue
        steps.append(step)
        shape = step.get("shape", shape)
    head = _head_step(rng, shape)
    if head is not None:
        steps.append(head)
    name = f"gen{seed}-{index}"
    program = GeneratedProgram(
        name=name,
        seed=(seed * 7919 + index * 104729) % (2**31),
        steps=steps,
        input_shape=input_shape,
        input_channels_last=(not contiguous) and rng.random() < 0.7,
    )
    layout = "cl" if program.input_channels_last else "contiguous"
    program.description = f"in{list(input_shape)} {layout}: " + " -> ".join(map(str, steps))
    return program


def program_named(name: str) -> GeneratedProgram:
    """The program a name like ``gen0-190`` (seed 0, index 190) names."""
    seed, sep, index = name.removeprefix("gen").partition("-")
    if not (name.startswith("gen") and sep and seed.isdigit() and index.isdigit()):
        raise ValueError(f"{name!r} is not a generated program name (gen<seed>-<index>)")
    return generated_program(int(seed), int(index))


def generated_programs(count: int, seed: int = 0) -> list[GeneratedProgram]:
    """The first ``count`` programs of the sequence ``seed`` names."""
    return [generated_program(seed, index) for index in range(count)]
