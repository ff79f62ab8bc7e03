"""The 4-layer transformer of the benchmark models in ``etmetal bench native``.

``etmetal.examples.bench.models()["transformer"]`` (4 pre-norm encoder layers, d_model 512,
sequence 128, batch 1: the model ``etmetal bench delegate`` has always measured) is
exported once. That one ``ExportedProgram`` is compiled by AOTInductor twice, with
libtorch for torch's own runner and without for etmetal's shims, and then lowered with
the Metal partitioner to a ``.pte``, so every arm runs code generated from the same
program. Before any timing, each arm's output is checked against torch's runner: bit for
bit where the arm runs the very same generated code (``etmetal_shims``), within float
tolerance where edge lowering may have regrouped the graph (the ``.pte`` arms).
"""

from __future__ import annotations

from pathlib import Path

import torch

CASE = "transformer"


def _lowered(ep, tmp: Path) -> Path:
    """``ep`` lowered for the host Metal target, written as a ``.pte`` in ``tmp``."""
    from executorch.exir import to_edge_transform_and_lower

    import etmetal

    edge = to_edge_transform_and_lower(ep, partitioner=[etmetal.MetalPartitioner()])
    path = tmp / "transformer.pte"
    path.write_bytes(edge.to_executorch(etmetal.backend_config()).buffer)
    return path


def bench_transformer(repeat: int, budget: float, tmp: Path, scale: int = 1) -> dict:
    """torch's runner, etmetal's shims (``AotiModel``), etmetal's ``.pte`` path and the
    stock runtime's backend over the transformer, interleaved; ``scale`` > 1 shrinks it
    (smoke tests)."""
    from etmetal.backend.aoti_compile import compile_exported_program
    from etmetal.bench.delegate import stock_method, torch_runner
    from etmetal.bench.native_arms import (
        counts_per_run,
        interleaved_cpu,
        report,
        stock_counts_per_run,
    )
    from etmetal.examples.bench import models
    from etmetal.runtime import Runtime
    from etmetal.shims import AotiModel, default_context

    spec = models(scale)[CASE]
    module = spec.make_module().eval()
    inputs = list(spec.make_inputs())
    with torch.no_grad():
        ep = torch.export.export(module, tuple(inputs))
    torch_art = compile_exported_program(ep, link_libtorch=True)
    art = compile_exported_program(ep)
    runner = torch_runner(torch_art.so_path, torch_art.weights_path)
    shims = AotiModel(art.so_path, art.weights_path.read_bytes())
    pte = _lowered(ep, tmp)  # last: lowering may rewrite the program it is given
    method = Runtime.get().load_program(str(pte), trust_native_code=True).load_method("forward")
    stock = stock_method(pte)
    want = runner.run(inputs)[0]
    got = {
        "etmetal_shims": shims.run(inputs)[0],
        "etmetal_pte": method.execute(inputs)[0],
        "stock_runtime": stock.execute(inputs)[0],
    }
    if not torch.equal(got["etmetal_shims"], want):
        err = (got["etmetal_shims"] - want).abs().max().item()
        raise SystemExit(f"native_shims: {CASE}: the shims' output differs from torch's ({err})")
    tol = 1e-4 * max(1.0, want.abs().max().item())
    for name, out in got.items():
        if out.shape != want.shape or not (out - want).abs().max().item() <= tol:
            raise SystemExit(f"native_shims: {CASE}: {name}'s output differs from torch's runner")
    ctx = default_context()
    arms = [
        ("torch_aoti", lambda: runner.run(inputs)),
        ("etmetal_shims", lambda: shims.run(inputs)),
        ("etmetal_pte", lambda: method.execute(inputs)),
        ("stock_runtime", lambda: stock.execute(inputs)),
    ]
    timings = interleaved_cpu(arms, repeat=repeat, inner=1, budget_s=budget)
    counts = {name: counts_per_run(ctx, fn) for name, fn in arms[1:3]}
    counts["stock_runtime"] = stock_counts_per_run(arms[3][1])
    result = {CASE: report(f"{CASE} ({spec.description})", timings, counts)}
    shims.close()
    return result
