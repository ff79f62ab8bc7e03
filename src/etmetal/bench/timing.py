"""Shared timing for ``etmetal bench`` and ``etmetal demo``: interleaved arms, medians,
ratios, machine facts.

The machine is shared and noisy, so every comparison runs its arms in turns
(A, B, A, B, ...) after a warm-up: load drifts hit every arm alike, and the
median of each arm is compared. ``torch.set_num_threads`` is fixed for all arms
(default 1) because OpenMP workers spinning on busy cores distort timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class Arm:
    """One side of a comparison: a name and a zero-argument function to time."""

    name: str
    fn: Callable[[], Any]
    inner: int | None = None  # calls per sample for this arm (default: interleaved's inner)


@dataclass
class Timing:
    name: str
    median_s: float
    min_s: float
    samples: int
    values_s: list[float] = field(default_factory=list, repr=False)  # in round order

    @property
    def median_us(self) -> float:
        return self.median_s * 1e6


def interleaved(
    arms: Sequence[Arm],
    *,
    repeat: int = 20,
    warmup: int = 2,
    inner: int = 1,
    budget_s: float | None = None,
) -> dict[str, Timing]:
    """Median and best seconds per call of each arm, the arms run in turns.

    ``inner`` calls make one sample (for calls too short to time alone);
    ``budget_s`` stops early (after at least 3 rounds) when the rounds take too long.
    """
    if not arms:
        raise ValueError("interleaved: no arms to time")
    for _ in range(warmup):
        for arm in arms:
            arm.fn()
    samples: list[list[float]] = [[] for _ in arms]
    start = time.perf_counter()
    for rnd in range(repeat):
        for i, arm in enumerate(arms):
            n = arm.inner or inner
            t0 = time.perf_counter()
            for _ in range(n):
                arm.fn()
            samples[i].append((time.perf_counter() - t0) / n)
        if budget_s is not None and rnd >= 2 and time.perf_counter() - start > budget_s:
            break
    return {
        arm.name: Timing(arm.name, statistics.median(s), min(s), len(s), s)
        for arm, s in zip(arms, samples)
    }


def paired_median_difference(a: Timing, b: Timing) -> float:
    """Median over rounds of ``a - b`` (seconds): each round's samples ran back to back."""
    return statistics.median(x - y for x, y in zip(a.values_s, b.values_s))


def calibrate_inner(fn: Callable[[], Any], target_s: float = 2e-3, cap: int = 10_000) -> int:
    """How many calls of ``fn`` make a sample of about ``target_s`` (at least 1)."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-9)
    return max(1, min(cap, int(target_s / one)))


@dataclass
class Comparison:
    """A row of a results table: timings of the arms and the ratio ``numerator/denominator``."""

    suite: str
    case: str
    timings: dict[str, Timing]
    ratios: dict[str, float] = field(default_factory=dict)
    target: dict[str, float] = field(default_factory=dict)  # ratio name -> max allowed
    extra: dict[str, Any] = field(default_factory=dict)

    def add_ratio(self, num: str, den: str, at_most: float | None = None) -> float:
        r = self.timings[num].median_s / self.timings[den].median_s
        key = f"{num}/{den}"
        self.ratios[key] = r
        if at_most is not None:
            self.target[key] = at_most
        return r

    def verdicts(self) -> dict[str, bool]:
        return {k: self.ratios[k] <= v for k, v in self.target.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "case": self.case,
            "median_us": {k: t.median_us for k, t in self.timings.items()},
            "min_us": {k: t.min_s * 1e6 for k, t in self.timings.items()},
            "samples": {k: t.samples for k, t in self.timings.items()},
            "ratios": self.ratios,
            "targets_at_most": self.target,
            "met": self.verdicts(),
            **({"extra": self.extra} if self.extra else {}),
        }


def print_comparison(c: Comparison) -> None:
    arms = "  ".join(f"{k} {t.median_us:10.1f} us" for k, t in c.timings.items())
    print(f"  {c.case:14s} {arms}")
    for k, r in c.ratios.items():
        lim = c.target.get(k)
        verdict = (
            "" if lim is None else (f"  (target <= {lim}: " + ("met)" if r <= lim else "MISSED)"))
        )
        print(f"  {'':14s}   ratio {k} = {r:.4g}{verdict}")


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:  # no /proc off Linux
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The facts a reader needs to judge the numbers."""
    try:
        import executorch.version as etv

        et_version = etv.__version__
    except Exception:  # noqa: BLE001 - a missing version module only loses one fact
        et_version = "unknown"
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "executorch": et_version,
        "torch_threads": torch.get_num_threads(),
        "loadavg": load,
    }


def add_common_arguments(
    parser: argparse.ArgumentParser, *, repeat: int = 20, models: Sequence[str] = ()
) -> None:
    """The options every suite takes; with ``models``, also ``--models`` and ``--budget``."""
    parser.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON ('-' = stdout)"
    )
    parser.add_argument(
        "--repeat", type=int, default=repeat, help="interleaved rounds per comparison"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads for every arm (default 1)"
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="divide model sizes by this (1 = the issue's sizes; larger for quick checks)",
    )
    if models:
        parser.add_argument("--models", default=",".join(models), help="comma-separated models")
        parser.add_argument(
            "--budget", type=float, default=20.0, help="seconds per model before stopping early"
        )


def emit(args: argparse.Namespace, suite: str, rows: Sequence[Comparison], **extra: Any) -> dict:
    """The suite's JSON document; written where ``--json`` says."""
    doc = {
        "suite": suite,
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_") and _plain(v)},
        "rows": [r.to_json() for r in rows],
        **extra,
    }
    path = getattr(args, "json", None)
    if path == "-":
        print(json.dumps(doc, indent=2, default=_default))
    elif path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2, default=_default)
    return doc


def _plain(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool, type(None), list, tuple))


def _default(o: Any) -> Any:
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    return str(o)
