"""Per-shim call counts, ``name -> (calls served in C, calls that reached Python)``, and
their differences around runs: what the tests of the native shims assert on (a steady run
makes no Python call; both implementations make the same calls)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

Counts = dict[str, tuple[int, int]]


def context_counts(context) -> Counts:
    """The counts of every model of ``context`` since its bridge was loaded."""
    return dict(context.load_bridge().shim_counts())


def model_counts(model) -> Counts:
    """``AotiModel.stats()`` as ``Counts``."""
    return {name: (c["native"], c["python"]) for name, c in model.stats().items()}


def delta(after: Counts, before: Counts) -> Counts:
    """The shims whose counts changed from ``before`` to ``after``, by how much."""
    out = {}
    for name, (native, python) in after.items():
        was = before.get(name, (0, 0))
        change = (native - was[0], python - was[1])
        if change != (0, 0):
            out[name] = change
    return out


def steady_runs(model, inputs: Sequence[torch.Tensor], runs: int = 3, settle: int = 0):
    """``model.run(inputs)`` once, ``settle`` times more, then ``runs`` counted times:
    (the first run's outputs, the last run's outputs, the counts of the counted runs)."""
    first = [t.clone() for t in model.run(list(inputs))]
    for _ in range(settle):
        model.run(list(inputs))
    before = model_counts(model)
    last = None
    for _ in range(runs):
        last = [t.clone() for t in model.run(list(inputs))]
    return first, last, delta(model_counts(model), before)


def lm_steps_on_each_implementation(
    pte: bytes, context, prompt: torch.Tensor, decode_steps: int = 4, steady_from: int = 2
) -> dict[str, tuple[list[torch.Tensor], Counts]]:
    """The two-method LM program ``pte`` through etmetal's runtime on the native shims and on
    the Python shims: prefill on ``prompt``, then greedy decode steps. Per implementation,
    every step's logits and the counts of the decode steps from ``steady_from`` on."""
    from etmetal.runtime import Runtime  # the runtime only where a test runs a program

    n = prompt.shape[1]
    out = {}
    for implementation in ("native", "python"):
        previous = context.set_implementation(implementation)
        try:
            program = Runtime.get().load_program(pte, trust_native_code=True)
            prefill, decode = program.load_method("prefill"), program.load_method("decode")
            logits = [prefill.execute([prompt, torch.arange(n)])[0].clone()]
            token = logits[0][..., -1, :].argmax(-1).view(1, 1)
            before = context_counts(context)
            for step in range(decode_steps):
                if step == steady_from:
                    before = context_counts(context)
                logits.append(decode.execute([token, torch.tensor([n + step])])[0].clone())
                token = logits[-1][..., -1, :].argmax(-1).view(1, 1)
            out[implementation] = (logits, delta(context_counts(context), before))
            prefill.destroy()
            decode.destroy()
            del prefill, decode, program
        finally:
            context.set_implementation(previous)
    return out
