"""The fuzz campaign's shim sequences on both shim implementations.

A sequence is a function ``sequence(rng, codes) -> (outcome, detail)`` that makes C shim
calls (as a ``.so`` would, through ``shims.c_api``) drawn from ``rng`` and appends each
call's (name, returned code) to ``codes``. :func:`on_both_implementations` runs it from one
seed on the native implementation and on the Python reference in turn: with the same
codes, the same later choices follow, so the two runs make the same calls, and every code
must agree. The fuzz worker runs its ``shim`` and ``metal_shims`` kinds this way, in its
subprocess: a crash of either implementation ends the worker and is charged to the case.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

IMPLEMENTATIONS = ("native", "python")


def _python_calls(ctx) -> int:
    # shim calls that went to Python so far, over every shim
    return sum(p for _, p in ctx.load_bridge().shim_counts().values())


def on_both_implementations(
    sequence: Callable[[random.Random, list], tuple[str, str]],
    case_seed: int,
    implementations: Sequence[str] = IMPLEMENTATIONS,
) -> tuple[str, str]:
    """``sequence(rng, codes)`` on each of ``implementations`` in turn, from
    the same seed: each run's own verdict, then every call's code must agree (a crash in
    either ends this process, and the campaign charges it to the case)."""
    from etmetal.shims import default_context

    ctx = default_context()
    runs = []
    for implementation in implementations:
        codes: list = []
        previous = ctx.set_implementation(implementation)
        in_python = _python_calls(ctx)
        try:
            outcome, detail = sequence(random.Random(case_seed), codes)
        finally:
            ctx.set_implementation(previous)
        if outcome == "BAD":
            return outcome, f"{implementation}: {detail}"
        if implementation == "python" and codes and _python_calls(ctx) == in_python:
            return "BAD", "the Python arm's calls never reached the Python shims"
        runs.append((implementation, outcome, detail, codes))
    (first, outcome, detail, want), *others = runs
    for other, _, _, got in others:
        for i, (a, b) in enumerate(zip(want, got)):
            if a != b:
                return "BAD", f"call {i}: {first} {a[0]} -> {a[1]}, {other} {b[0]} -> {b[1]}"
        if len(want) != len(got):
            return "BAD", f"{first} made {len(want)} calls, {other} {len(got)}"
    return outcome, f"{detail} ({'/'.join(implementations)}: {len(want)} calls agree)"
