"""Models lowered for ``mps_emulated`` run under the Metal checker (``etmetal regress
metal-check``): each must run clean (no fault) and still match eager PyTorch.

For every model: lower it for the emulated Metal target, run it once unchecked and once under
``memcheck,racecheck`` in report mode (the faults are collected, the run goes on), compare both
outputs with eager, and time steady executes of both, taking turns (the median of ``repeats``
each; the checked build of each kernel is compiled by the first checked run, untimed).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from etmetal.backend.lowering import lower
from etmetal.common.targets import MPS_EMULATED
from etmetal.examples.demo import DEMO_MODELS, DEMO_MODELS_BY_NAME, get_demo
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.runtime import Runtime
from etmetal.shims import default_context
from etmetal.shims.emulated_mps import mps_device
from etmetal.shims.emulated_mps.msl import checked_accesses

TARGET = MPS_EMULATED.name
MODE = "memcheck,racecheck,report"


@dataclass
class CheckResult:
    name: str
    faults: list[str] = field(default_factory=list)
    matches_eager: bool = False
    checked_accesses: int = 0
    unchecked_ms: float = 0.0
    checked_ms: float = 0.0
    error: str = ""

    @property
    def clean(self) -> bool:
        return not self.error and not self.faults and self.matches_eager

    @property
    def slowdown(self) -> float:
        return self.checked_ms / self.unchecked_ms if self.unchecked_ms else 0.0


def model_names() -> list[str]:
    """The Metal registry's modules, then the demo models (``demo:<name>``)."""
    return list(REGISTRY) + [f"demo:{d.name}" for d in DEMO_MODELS]


def make_model(name: str) -> tuple[torch.nn.Module, tuple, float, float]:
    """(module, inputs, atol, rtol) of a registry module or ``demo:<name>``."""
    if name.startswith("demo:"):
        demo = name.removeprefix("demo:")
        module, inputs = get_demo(demo)
        return module, inputs, DEMO_MODELS_BY_NAME[demo].atol, DEMO_MODELS_BY_NAME[demo].rtol
    module, inputs = get_model_and_inputs(name)
    return module.eval(), inputs, REGISTRY[name].atol, REGISTRY[name].rtol


def _load_method(pte: bytes):
    return Runtime.get().load_program(pte, trust_native_code=True).load_method("forward")


def _matches(got: list[torch.Tensor], expected: list[torch.Tensor], atol, rtol) -> bool:
    if len(got) != len(expected):
        return False
    for g, e in zip(got, expected):
        if g.shape != e.shape or g.dtype != e.dtype:
            return False
        if not torch.allclose(g, e, atol=atol, rtol=rtol, equal_nan=True):
            return False
    return True


def _timed_ms(method, inputs: tuple) -> float:
    start = time.perf_counter()
    method.execute(list(inputs))
    return (time.perf_counter() - start) * 1e3


def _interleaved_ms(ctx, method, inputs: tuple, repeats: int) -> tuple[float, float]:
    """Median execute time unchecked and checked, the two modes taking turns (load drifts
    on a shared machine hit both alike)."""
    plain, checked = [], []
    for _ in range(repeats):
        mps_device.set_metal_check(ctx, None)
        plain.append(_timed_ms(method, inputs))
        mps_device.set_metal_check(ctx, MODE)
        checked.append(_timed_ms(method, inputs))
    mps_device.check_report(ctx)
    return statistics.median(plain), statistics.median(checked)


def check_model(name: str, repeats: int = 3) -> CheckResult:
    """Lower ``name`` for ``mps_emulated`` and run it unchecked and under the checker."""
    result = CheckResult(name)
    ctx = default_context()
    previous = mps_device.set_metal_check(ctx, None)
    try:
        module, inputs, atol, rtol = make_model(name)
        with torch.no_grad():
            out = module(*inputs)
        expected = list(out) if isinstance(out, (tuple, list)) else [out]
        program, _ = lower(module, inputs, target=TARGET)
        method = _load_method(program.buffer)
        try:
            plain = method.execute(list(inputs))
            mps_device.set_metal_check(ctx, MODE)
            mps_device.check_report(ctx)
            before = checked_accesses()
            checked = method.execute(list(inputs))  # builds the checked libraries too
            result.checked_accesses = checked_accesses() - before
            result.faults = [str(f) for f in mps_device.check_report(ctx)]
            result.unchecked_ms, result.checked_ms = _interleaved_ms(ctx, method, inputs, repeats)
        finally:
            method.destroy()
        result.matches_eager = _matches(plain, expected, atol, rtol) and _matches(
            checked, expected, atol, rtol
        )
    except Exception as exc:  # a model that fails is a row of the report, not the end of it
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        mps_device.set_metal_check(ctx, previous)
    return result
