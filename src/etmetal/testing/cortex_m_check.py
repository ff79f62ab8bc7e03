"""One Cortex-M zoo case lowered, run in etmetal's runtime and checked (``etmetal regress cortex-m``).

Each zoo case is lowered through ExecuTorch's Cortex-M flow to a ``.pte``
(cached by content), run by ``etmetal.runtime`` on this host (the ``cortex_m::``
operators through etmetal's reference kernels), and compared with the flow's
own reference of the same quantized program: a case passes when every output is
within ``atol + qtol * scale`` (``rtol`` 1e-3) of it, ``qtol`` being the one the
upstream test uses. The table also says whether the run is bit-exact with the
Cortex-M dialect program evaluated on ExecuTorch's Python reference kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from etmetal.examples.cortex_m_zoo import ZooCase

ATOL = 1e-3  # the upstream tester's defaults
RTOL = 1e-3


@dataclass
class CaseResult:
    model: str
    group: str
    status: str  # pass | fail | error | unavailable
    qtol: int
    ops: int = 0
    operators: list[str] = field(default_factory=list)
    max_error: float | None = None  # max |runtime - reference| over all outputs
    max_error_steps: float | None = None  # the same in quantization steps of the output
    tolerance: float | None = None
    exact_vs_dialect: bool | None = None
    # the flow's own cortex_m program against the same reference, in quantization steps
    dialect_error_steps: float | None = None
    top1_match: bool | None = None  # argmax of each output agrees with the reference's
    lower_seconds: float | None = None
    cached: bool | None = None
    load_seconds: float | None = None
    run_seconds: float | None = None
    detail: str = ""


def _compare(result: CaseResult, lowered, outputs: list) -> None:
    refs, dialect = lowered.reference_outputs, lowered.dialect_outputs
    tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
    if len(tensors) != len(refs):
        result.status = "fail"
        result.detail = f"{len(tensors)} tensor outputs, the reference has {len(refs)}"
        return
    scale = lowered.quant_scale
    result.tolerance = ATOL + (scale * result.qtol if scale else 0.0)
    max_error, dialect_error, ok, exact, top1 = 0.0, 0.0, True, True, True
    for i, (out, ref, dia) in enumerate(zip(tensors, refs, dialect)):
        if out.shape != ref.shape:
            result.status = "fail"
            result.detail = f"output {i} has shape {list(out.shape)}, reference {list(ref.shape)}"
            return
        max_error = max(max_error, _max_abs_diff(out, ref))
        dialect_error = max(dialect_error, _max_abs_diff(dia, ref))
        ok &= torch.allclose(
            out.to(ref.dtype), ref, atol=result.tolerance, rtol=RTOL, equal_nan=True
        )
        exact &= out.shape == dia.shape and torch.equal(out.to(dia.dtype), dia)
        top1 &= out.numel() == 0 or bool(out.argmax() == ref.argmax())
    result.max_error = max_error
    result.max_error_steps = max_error / scale if scale else None
    result.dialect_error_steps = dialect_error / scale if scale else None
    result.exact_vs_dialect = bool(exact)
    result.top1_match = bool(top1)
    result.status = "pass" if ok else "fail"
    if not ok:
        result.detail = f"max error {max_error:.4g} > tolerance {result.tolerance:.4g}"
        if exact:
            steps = f" ({result.dialect_error_steps:.0f} steps)" if scale else ""
            result.detail += (
                "; the flow's own cortex_m program (ExecuTorch's Python kernels) is as far"
                f" from its reference{steps} and this run matches it bit for bit: the"
                " lowering, not the runtime, exceeds qtol"
                f"{'; top-1 agrees' if top1 else ''}"
            )


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return (a.to(torch.float64) - b.to(torch.float64)).abs().max().item()


def run_case(case: ZooCase, cache_dir=None, use_cache: bool = True) -> CaseResult:
    from etmetal.examples.cortex_m_lowering import lower_case

    result = CaseResult(case.name, case.group, "error", case.qtol)
    reason = case.unavailable()
    if reason:
        result.status, result.detail = "unavailable", reason
        return result
    try:
        lowered = lower_case(case, cache_dir=cache_dir, use_cache=use_cache)
    except Exception as exc:  # a lowering failure is a result of this suite, not a crash
        result.detail = f"lowering failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        return result
    result.operators, result.ops = lowered.operators, len(lowered.operators)
    result.lower_seconds, result.cached = round(lowered.lower_seconds, 2), lowered.from_cache
    try:
        from etmetal.runtime import Runtime

        start = time.perf_counter()
        method = Runtime.get().load_program(str(lowered.pte_path)).load_method("forward")
        result.load_seconds = round(time.perf_counter() - start, 4)
        inputs = [t.clone(memory_format=torch.preserve_format) for t in lowered.inputs]
        start = time.perf_counter()
        outputs = method.execute(inputs)
        result.run_seconds = round(time.perf_counter() - start, 4)
    except Exception as exc:
        result.detail = f"runtime: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        return result
    _compare(result, lowered, list(outputs))
    return result
