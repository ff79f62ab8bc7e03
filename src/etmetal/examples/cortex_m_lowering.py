"""Lower a Cortex-M zoo case through ExecuTorch's Cortex-M flow, with a content-keyed cache.

The flow is the one ExecuTorch's Cortex-M tests drive (``CortexMTester``):
CortexMQuantizer (PT2E) -> export -> to_edge -> CortexMPassManager (replaces
quantized patterns with ``cortex_m::`` operators) -> to_executorch -> ``.pte``.

Two references come out of the same lowering, both evaluated in eager PyTorch:

- the flow's reference: the quantized exported program (quantize/dequantize
  around float ops), plus the scale of its output dequantization; the upstream
  tests accept an implementation within ``atol + qtol * scale`` of it;
- the dialect program: the graph after the Cortex-M passes, run through the
  ``cortex_m::`` Python reference implementations. A faithful runtime matches it
  bit for bit.

A cache entry holds the ``.pte`` and both references; its key hashes everything
that determines them (model code and weights, inputs, calibration data, torch and
executorch versions), so reruns skip the lowering (kind ``cortex_m`` of
:mod:`etmetal.common.cache`).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import torch

from etmetal.common.cache import ContentCache
from etmetal.examples.cortex_m_zoo import ZooCase

# bump when the layout of a cache entry or the lowering recipe changes
_CACHE_FORMAT = 1


@dataclass
class LoweredCase:
    name: str
    pte_path: Path
    inputs: tuple[torch.Tensor, ...]
    reference_outputs: list[torch.Tensor]  # the flow's reference (quantized exported program)
    quant_scale: float | None  # scale of the reference's output dequantize, if any
    dialect_outputs: list[torch.Tensor]  # the cortex_m dialect program on the Python references
    operators: list[str]  # the program's operator table, "ns::name.overload"
    lower_seconds: float
    from_cache: bool


def _hash_tensor(h, t: torch.Tensor) -> None:
    h.update(f"{t.dtype}{tuple(t.shape)}{t.stride()}".encode())
    h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def cache_key(case: ZooCase, model: torch.nn.Module, inputs, calibration) -> str:
    h = hashlib.sha256()
    h.update(f"{_CACHE_FORMAT}|{torch.__version__}|{version('executorch')}|{case.name}".encode())
    h.update(f"{type(model).__module__}.{type(model).__qualname__}|{model!r}".encode())
    # the forward code too: the same modules wired differently lower differently
    for cls in sorted({type(m) for m in model.modules()}, key=lambda c: c.__qualname__):
        try:
            h.update(inspect.getsource(cls).encode())
        except (OSError, TypeError):
            h.update(f"{cls.__module__}.{cls.__qualname__}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        _hash_tensor(h, tensor)
    for sample in [tuple(inputs)] + [tuple(s) for s in calibration or []]:
        h.update(b"|sample")
        for t in sample:
            _hash_tensor(h, t)
    return h.hexdigest()


def _as_list(outputs) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [o for o in outputs if isinstance(o, torch.Tensor)]


def _lower(case: ZooCase, model, inputs, calibration, entry: Path) -> None:
    """Run the flow and write the cache entry's files into the directory ``entry``."""
    # imported here: the Cortex-M flow pulls in the Arm backend and quantizer (seconds)
    from executorch.backends.cortex_m.test.tester import CortexMQuantize, CortexMTester
    from executorch.backends.test.harness.stages import StageType
    from executorch.exir._serialize._program import deserialize_pte_binary

    start = time.perf_counter()
    tester = CortexMTester(model, inputs)
    tester.quantize(CortexMQuantize(calibration_samples=calibration) if calibration else None)
    tester.export()
    tester.to_edge()
    tester.run_passes()
    with torch.no_grad():
        reference, scale = tester._calculate_reference_output(
            tester.get_artifact(StageType.EXPORT), inputs
        )
        # before to_executorch, which rewrites this program into out variants in place
        dialect = tester.stages[StageType.RUN_PASSES].run_artifact(inputs)
    tester.to_executorch()
    buffer = tester.get_artifact(StageType.TO_EXECUTORCH).buffer
    seconds = time.perf_counter() - start

    pte = deserialize_pte_binary(buffer)
    program = getattr(pte, "program", pte)
    operators = sorted(
        {
            f"{op.name}.{op.overload}" if op.overload else op.name
            for plan in program.execution_plan
            for op in plan.operators
        }
    )
    (entry / "program.pte").write_bytes(buffer)
    blob = io.BytesIO()
    torch.save(
        {
            "inputs": tuple(inputs),
            "reference": _as_list(reference),
            "dialect": _as_list(dialect),
        },
        blob,
    )
    (entry / "references.pt").write_bytes(blob.getvalue())
    meta = {
        "case": case.name,
        "quant_scale": scale,
        "operators": operators,
        "lower_seconds": seconds,
    }
    (entry / "meta.json").write_text(json.dumps(meta, indent=1))


def _load(case: ZooCase, entry: Path, from_cache: bool) -> LoweredCase:
    meta = json.loads((entry / "meta.json").read_text())
    refs = torch.load(entry / "references.pt", weights_only=True)
    return LoweredCase(
        name=case.name,
        pte_path=entry / "program.pte",
        inputs=tuple(refs["inputs"]),
        reference_outputs=list(refs["reference"]),
        quant_scale=meta["quant_scale"],
        dialect_outputs=list(refs["dialect"]),
        operators=list(meta["operators"]),
        lower_seconds=float(meta["lower_seconds"]),
        from_cache=from_cache,
    )


def lower_case(
    case: ZooCase, cache_dir: str | Path | None = None, use_cache: bool = True
) -> LoweredCase:
    """The lowered program of ``case`` and its references, from the cache when possible."""
    reason = case.unavailable()
    if reason:
        raise RuntimeError(f"zoo case {case.name!r} is unavailable: {reason}")
    model, inputs = case.build()
    calibration = case.calibration() if case.calibration else None
    key = cache_key(case, model, inputs, calibration)
    entry, hit = ContentCache("cortex_m", cache_dir).get_or_create(
        f"{case.name}-{key[:24]}",
        lambda tmp: _lower(case, model, inputs, calibration, tmp),
        refresh=not use_cache,
    )
    return _load(case, entry, from_cache=hit)
