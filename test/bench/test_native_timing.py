"""``etmetal bench native``'s timing: the Python-shims arms never run between the native
arms' samples, and each keeps a paired ratio over torch samples of its own rounds."""

from __future__ import annotations

import time

from etmetal.bench.native_arms import interleaved_apart


def test_python_arms_are_timed_apart_from_the_native_arms():
    calls: list[str] = []

    def arm(name: str, seconds: float):
        def run():
            calls.append(name)
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass

        return name, run

    arms = [arm("torch_aoti", 0.002), arm("etmetal_native", 0.002), arm("etmetal_python", 0.006)]
    timings = interleaved_apart(arms, {"etmetal_python"}, repeat=6, inner=1, budget_s=10.0)
    assert list(timings) == ["torch_aoti", "etmetal_native", "etmetal_python"]
    last_native = max(i for i, n in enumerate(calls) if n == "etmetal_native")
    first_python = calls.index("etmetal_python")
    assert last_native < first_python  # no Python arm ran between native samples
    assert calls[last_native + 1 :].count("torch_aoti") >= 6  # its own torch rounds
    assert timings["etmetal_python"][2] > 2.0  # ~3x over its own rounds' torch samples
    assert 0.5 < timings["etmetal_native"][2] < 2.0
