"""The Cortex-M model zoo of ExecuTorch's Cortex-M tests (``backends/cortex_m/test/models``).

Each case names the model, how to build it with its example inputs, and the
``qtol`` the upstream test accepts against the flow's reference. Models that the
installed ``executorch`` wheel provides (the MLPerf Tiny models, silero VAD, the
small ``nn``-module cases of ``test_nn_modules``/``test_nn_functional``/
``test_torch_functions``) are imported from it. The upstream MobileNet tests take
their models from torchvision, which is not a dependency here, so MobileNet V2
and V3-small are defined below with the same architectures (random weights,
smaller inputs). Models whose dependencies are missing stay listed with the
reason, so a run reports them instead of silently dropping them.

Everything is deterministic: models, inputs and calibration data come from a
seeded generator, so the lowered program's content (and its cache key) is stable.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

Inputs = tuple[torch.Tensor, ...]
CL = torch.channels_last


@dataclass(frozen=True)
class ZooCase:
    name: str
    group: str  # "model" (the upstream model tests) or "module" (small nn cases)
    build: Callable[[], tuple[nn.Module, Inputs]]
    qtol: int
    calibration: Callable[[], list[Inputs]] | None = None
    source: str = ""
    # why the case cannot run here (missing optional dependency), if so
    unavailable: Callable[[], str | None] = field(default=lambda: None)


def _rand(
    *shape: int, seed: int, channels_last: bool = False, uniform: bool = True
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=gen) * 2 - 1) if uniform else torch.randn(shape, generator=gen)
    return t.to(memory_format=CL) if channels_last else t


def _seeded(factory: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return factory().eval()


def _missing(module: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"needs {exc.name or module} (not installed)"
        return None

    return check


# ---------------------------------------------------------------- MobileNet V2 (torchvision's)


def _conv_bn_act(cin, cout, k, stride=1, groups=1, act: type[nn.Module] | None = nn.ReLU6):
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class _InvertedResidualV2(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn_act(cin, hidden, 1)]
        layers += [
            _conv_bn_act(hidden, hidden, 3, stride, groups=hidden),
            _conv_bn_act(hidden, cout, 1, act=None),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's ``mobilenet_v2`` (width 1.0): 52 convolutions, 10 residual adds."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]  # fmt: skip

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_act(3, 32, 3, 2)]
        cin = 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(_InvertedResidualV2(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(_conv_bn_act(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        _torchvision_init(self)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------- MobileNet V3 small (torchvision's)


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class _SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.relu, self.gate = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.relu(self.fc1(s))))


class _InvertedResidualV3(nn.Module):
    def __init__(self, cin, k, hidden, cout, se: bool, act: type[nn.Module], stride: int):
        super().__init__()
        layers: list[nn.Module] = []
        if hidden != cin:
            layers.append(_conv_bn_act(cin, hidden, 1, act=act))
        layers.append(_conv_bn_act(hidden, hidden, k, stride, groups=hidden, act=act))
        if se:
            layers.append(_SqueezeExcitation(hidden, _make_divisible(hidden // 4)))
        layers.append(_conv_bn_act(hidden, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV3Small(nn.Module):
    """torchvision's ``mobilenet_v3_small``: hardswish, squeeze-excitation (mul), 52 convolutions."""

    RE, HS = nn.ReLU, nn.Hardswish
    # input, kernel, expanded, output, squeeze-excitation, activation, stride
    SETTINGS = [(16, 3, 16, 16, True, RE, 2), (16, 3, 72, 24, False, RE, 2),
                (24, 3, 88, 24, False, RE, 1), (24, 5, 96, 40, True, HS, 2),
                (40, 5, 240, 40, True, HS, 1), (40, 5, 240, 40, True, HS, 1),
                (40, 5, 120, 48, True, HS, 1), (48, 5, 144, 48, True, HS, 1),
                (48, 5, 288, 96, True, HS, 2), (96, 5, 576, 96, True, HS, 1),
                (96, 5, 576, 96, True, HS, 1)]  # fmt: skip

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_act(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [_InvertedResidualV3(*s) for s in self.SETTINGS]
        layers.append(_conv_bn_act(96, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(1024, num_classes)
        )
        _torchvision_init(self)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def _torchvision_init(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)


# ---------------------------------------------------------------- the zoo


def _mlperf(module: str, cls: str, *shape: int, channels_last: bool = True):
    def build():
        model_cls = getattr(
            importlib.import_module(f"executorch.examples.models.mlperf_tiny.{module}"), cls
        )
        return _seeded(model_cls), (_rand(*shape, seed=1, channels_last=channels_last),)

    return build


def _recalibrate_batchnorm(model: nn.Module, size: int) -> nn.Module:
    """Set every BatchNorm's statistics from random images. Random weights with identity
    BatchNorms let activations die out through the depth (the output range collapses
    to ~1e-5); normalized layers keep the network in a realistic numeric range."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for i in range(4):
            model(_rand(8, 3, size, size, seed=50 + i, uniform=False))
    return model.eval()


def _mobilenet(cls: type[nn.Module], size: int):
    def build():
        model = _recalibrate_batchnorm(_seeded(cls), size)
        return model, (_rand(1, 3, size, size, seed=1, channels_last=True, uniform=False),)

    def calibration():
        return [
            (_rand(1, 3, size, size, seed=100 + i, channels_last=True, uniform=False),)
            for i in range(8)
        ]

    return build, calibration


def _silero():
    from executorch.examples.models.silero_vad import export_silero_vad as sv

    x = _rand(1, sv.CONTEXT_SIZE + sv.WINDOW_SIZE, seed=1, uniform=False)
    return _seeded(sv.SileroVAD16k), (x, torch.zeros(2, 1, sv.HIDDEN_DIM))


def _model_cases() -> list[ZooCase]:
    mv2_build, mv2_cal = _mobilenet(MobileNetV2, 96)
    mv3_build, mv3_cal = _mobilenet(MobileNetV3Small, 96)
    mlperf = "executorch.examples.models.mlperf_tiny"
    return [
        ZooCase(
            "ds_cnn",
            "model",
            _mlperf("ds_cnn", "DSCNNKWS", 1, 1, 49, 10),
            1,
            source=f"{mlperf}.ds_cnn",
        ),
        ZooCase(
            "resnet8",
            "model",
            _mlperf("resnet8", "ResNet8", 1, 3, 32, 32),
            1,
            source=f"{mlperf}.resnet8",
        ),
        ZooCase(
            "deep_autoencoder",
            "model",
            _mlperf("deep_autoencoder", "DeepAutoEncoder", 1, 640, channels_last=False),
            1,
            source=f"{mlperf}.deep_autoencoder",
        ),  # fmt: skip
        ZooCase(
            "mobilenet_v1_025",
            "model",
            _mlperf("mobilenet_v1_025", "MobileNetV1025", 1, 3, 96, 96),
            1,
            source=f"{mlperf}.mobilenet_v1_025",
        ),  # fmt: skip
        ZooCase(
            "mobilenet_v2",
            "model",
            mv2_build,
            10,
            mv2_cal,
            source="etmetal definition of torchvision mobilenet_v2 (96x96, random weights)",
        ),  # fmt: skip
        ZooCase(
            "mobilenet_v3_small",
            "model",
            mv3_build,
            20,
            mv3_cal,
            source="etmetal definition of torchvision mobilenet_v3_small (96x96, random weights)",
        ),  # fmt: skip
        ZooCase(
            "silero_vad_16k",
            "model",
            _silero,
            10,
            source="executorch.examples.models.silero_vad.export_silero_vad",
        ),  # fmt: skip
        ZooCase(
            "wav2letter",
            "model",
            _unavailable,
            10,
            source="executorch.examples.models.wav2letter",
            unavailable=_missing("torchaudio"),
        ),  # fmt: skip
        ZooCase(
            "yolo11n",
            "model",
            _unavailable,
            10,
            source="ultralytics yolo11n.pt",
            unavailable=lambda: "needs ultralytics and the yolo11n.pt weights (a download)",
        ),  # fmt: skip
    ]


def _unavailable():
    raise RuntimeError("this zoo case is unavailable on this machine")


# upstream test module -> the qtol its dialect test uses
_MODULE_TESTS = {"test_nn_modules": 2, "test_nn_functional": 1, "test_torch_functions": 2}


def _module_cases() -> list[ZooCase]:
    cases = []
    for test_module, qtol in _MODULE_TESTS.items():
        path = f"executorch.backends.cortex_m.test.models.{test_module}"
        try:
            names = list(importlib.import_module(path).test_cases)
        except ImportError:
            continue

        for name in names:

            def build(path=path, name=name):
                case = importlib.import_module(path).test_cases[name]
                return case.model.eval(), tuple(case.get_example_inputs())

            cases.append(ZooCase(name, "module", build, qtol, source=f"{path}::{name}"))
    return cases


def zoo() -> dict[str, ZooCase]:
    """Every zoo case by name: the upstream model tests first, then the small module cases."""
    return {case.name: case for case in _model_cases() + _module_cases()}
