"""Native shims against the Python reference and torch's AOTI runner (``etmetal bench native``).

For the two-method LM (decode step, prefill), the tiny model (through the shims and
through the ``.pte`` path), a model whose ``.so`` calls the proxy executor and the 4-layer
transformer (``native_transformer.py``), run interleaved in one process: torch's own runner over the
same exported method built with libtorch, and etmetal on its native shims and on its
Python shims (``ShimContext.set_implementation``). Each arm reports the median CPU time
(``time.process_time``) beside the median wall time, and etmetal's arms the shim calls
per run that were served in C and that reached Python (``Bridge.shim_counts``). The
``stock_runtime`` arm is the same ``.pte`` in ExecuTorch's own runtime on etmetal's native
``MetalBackend`` (:mod:`etmetal.stock_runtime`).

Run it with ``etmetal bench native [--config tiny|30m]``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from etmetal.bench.native_arms import (
    counts_per_run,
    interleaved_apart,
    report,
    stock_counts_per_run,
)
from etmetal.bench.sections import write_section

PROMPT = 32
# the arms on the Python shims (the reference), timed apart from the native ones
PYTHON_ARMS = {"etmetal_python", "etmetal_shims_py"}


def _switching(ctx, shims: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run on the ``shims`` implementation of ``ctx`` (switched per call: cheap)."""

    def run():
        previous = ctx.set_implementation(shims)
        try:
            return fn()
        finally:
            ctx.set_implementation(previous)

    return run


def bench_lm(config: str, programs: Path, repeat: int, budget: float) -> dict:
    from etmetal.bench.llm import _runner, lower_programs
    from etmetal.examples import llm
    from etmetal.runtime import Runtime
    from etmetal.shims import default_context

    model = llm.make_decoder_lm(llm.CONFIGS[config])
    pte = lower_programs(model, config, programs)["shared"]
    exports = llm.lm_exports(model, prompt_len=PROMPT)
    ctx = default_context()
    cases = {
        "prefill": [torch.randint(0, model.cfg.vocab, (1, PROMPT)), torch.arange(PROMPT)],
        "decode": [torch.tensor([[7]]), torch.tensor([PROMPT])],
    }
    # one program per implementation, loaded once: prefill fills the KV cache its decode
    # method reads (the shared layout), as in the eager model
    programs_by_shims = {}
    for shims in ("native", "python"):
        ctx.set_implementation(shims)  # the methods' constants follow it at load
        programs_by_shims[shims] = Runtime.get().load_program(str(pte), trust_native_code=True)
    ctx.set_implementation("native")
    # the same program in ExecuTorch's own runtime, on etmetal's native MetalBackend
    from executorch.runtime import Runtime as StockRuntime

    from etmetal import stock_runtime

    stock_runtime.register(trust_native_code=True)
    stock_program = StockRuntime.get().load_program(str(pte))
    out = {}
    for name, inputs in cases.items():
        runs = {}
        for shims, program in programs_by_shims.items():
            if shims == "python":
                ctx.set_implementation(shims)
            try:
                runs[shims] = (program, program.load_method(name))
            finally:
                ctx.set_implementation("native")
        runner = _runner(exports[name])
        with torch.no_grad():
            want = model(*inputs)
        outs = {s: m.execute(inputs)[0] for s, (_, m) in runs.items()}
        outs["torch_aoti"] = runner.run(inputs)[0]
        stock_m = stock_program.load_method(name)
        outs["stock_runtime"] = stock_m.execute(inputs)[0]
        errs = {k: (v - want).abs().max().item() for k, v in outs.items()}
        if max(errs.values()) > 1e-3 * max(1.0, want.abs().max().item()):
            raise SystemExit(f"native_shims: {name}: outputs differ from eager: {errs}")
        native_m, python_m = runs["native"][1], runs["python"][1]
        arms = [
            ("torch_aoti", lambda r=runner, i=inputs: r.run(i)),
            ("etmetal_native", lambda m=native_m, i=inputs: m.execute(i)),
            (
                "etmetal_python",
                _switching(ctx, "python", lambda m=python_m, i=inputs: m.execute(i)),
            ),
            ("stock_runtime", lambda m=stock_m, i=inputs: m.execute(i)),
        ]
        timings = interleaved_apart(arms, PYTHON_ARMS, repeat=repeat, inner=1, budget_s=budget)
        counts = {
            "etmetal_native": counts_per_run(ctx, arms[1][1]),
            "etmetal_python": counts_per_run(ctx, arms[2][1]),
            "stock_runtime": stock_counts_per_run(arms[3][1]),
        }
        out[f"lm_{config}_{name}"] = report(f"lm {config} {name}", timings, counts)
    return out


def bench_tiny(repeat: int, budget: float, tmp: Path) -> dict:
    from etmetal.backend.aoti_compile import compile_exported_program
    from etmetal.bench.delegate import delegate_method, stock_method, torch_runner
    from etmetal.examples.bench import models
    from etmetal.shims import AotiModel, default_context

    spec = models()["tiny"]
    module = spec.make_module().eval()
    inputs = list(spec.make_inputs())
    ep = torch.export.export(module, tuple(inputs))
    art = compile_exported_program(ep)
    torch_art = compile_exported_program(ep, link_libtorch=True)
    runner = torch_runner(torch_art.so_path, torch_art.weights_path)
    ctx = default_context()
    blob = art.weights_path.read_bytes()
    native = AotiModel(art.so_path, blob)
    method, _ = delegate_method(module, tuple(inputs), tmp)
    stock = stock_method(tmp / "model.pte")
    with torch.no_grad():
        want = module(*inputs)
    runs = (native.run(inputs), method.execute(inputs), runner.run(inputs), stock.execute(inputs))
    for got in (r[0] for r in runs):
        if not torch.allclose(got, want, atol=1e-5):
            raise SystemExit("native_shims: tiny: outputs differ from eager")
    arms = [
        ("torch_aoti", lambda: runner.run(inputs)),
        ("etmetal_shims", lambda: native.run(inputs)),
        ("etmetal_pte", lambda: method.execute(inputs)),
        ("etmetal_shims_py", _switching(ctx, "python", lambda: native.run(inputs))),
        ("stock_runtime", lambda: stock.execute(inputs)),
    ]
    timings = interleaved_apart(arms, PYTHON_ARMS, repeat=repeat, inner=2000, budget_s=budget)
    # the stock runtime's backend has its own native layer, with its own counters
    counts = {name: counts_per_run(ctx, fn) for name, fn in arms[1:4]}
    counts["stock_runtime"] = stock_counts_per_run(arms[4][1])
    result = {"tiny": report("tiny", timings, counts)}
    native.close()
    return result


class _AntialiasedUpsample(torch.nn.Module):
    """An ATen operator without a C shim: every run calls the proxy executor once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.interpolate(x, size=(14, 18), mode="bicubic", antialias=True)
        return y.tanh()


def bench_proxy(repeat: int, budget: float, tmp: Path) -> dict:
    """A model whose ``.so`` calls the proxy executor: torch's runner (libtorch's own
    proxy executor over the table beside the ``.so``), etmetal's native executor, the
    Python executor, and the stock runtime's backend."""
    import shutil

    from etmetal.backend.aoti_compile import compile_exported_program
    from etmetal.backend.lowering import lower
    from etmetal.bench.delegate import stock_method, torch_runner
    from etmetal.common.targets import HOST
    from etmetal.shims import AotiModel, default_context

    module, inputs = _AntialiasedUpsample().eval(), [torch.randn(1, 3, 8, 10)]
    ep = torch.export.export(module, tuple(inputs))
    art, torch_art = compile_exported_program(ep), compile_exported_program(ep, link_libtorch=True)
    # torch's runner finds the table as <so stem>.json beside the .so
    shutil.copy(torch_art.so_path, tmp / "proxy_model.so")
    shutil.copy(torch_art.extern_nodes_path, tmp / "proxy_model.json")
    runner = torch_runner(tmp / "proxy_model.so", torch_art.weights_path)
    ctx = default_context()
    native = AotiModel(
        art.so_path, art.weights_path.read_bytes(), extern_nodes=art.extern_nodes_bytes()
    )
    program, _ = lower(module, tuple(inputs), target=HOST)
    (tmp / "proxy.pte").write_bytes(program.buffer)
    stock = stock_method(tmp / "proxy.pte")
    with torch.no_grad():
        want = module(*inputs)
    for got in (native.run(inputs)[0], runner.run(inputs)[0], stock.execute(inputs)[0]):
        if not torch.allclose(got, want, atol=1e-5):
            raise SystemExit("native_shims: proxy: outputs differ from eager")
    arms = [
        ("torch_aoti", lambda: runner.run(inputs)),
        ("etmetal_shims", lambda: native.run(inputs)),
        ("etmetal_shims_py", _switching(ctx, "python", lambda: native.run(inputs))),
        ("stock_runtime", lambda: stock.execute(inputs)),
    ]
    timings = interleaved_apart(arms, PYTHON_ARMS, repeat=repeat, inner=500, budget_s=budget)
    counts = {name: counts_per_run(ctx, fn) for name, fn in arms[1:3]}
    counts["stock_runtime"] = stock_counts_per_run(arms[3][1])
    result = {"proxy_upsample": report("proxy_upsample", timings, counts)}
    native.close()
    return result


# issue 25's targets, CPU time over torch's runner: (case prefix, arm) -> at most
TARGETS = {
    ("tiny", "etmetal_shims"): 1.5,
    ("tiny", "etmetal_pte"): 2.0,
    ("lm_", "etmetal_native"): 1.05,
    ("transformer", "etmetal_shims"): 1.05,
    ("transformer", "etmetal_pte"): 1.05,
}


def _target(case: str, arm: str) -> float | None:
    return next((v for (c, a), v in TARGETS.items() if case.startswith(c) and a == arm), None)


def render(results: dict[str, dict], command: str, started: str) -> str:
    """The BENCHMARKS.md section of one run (``results``: case -> arm -> row)."""
    lines = [
        "## Native shims vs Python shims vs torch's AOTI runner (issue 25)",
        "",
        f"Generated by `{command}` ({started}). Each case's arms run interleaved in one "
        "process, 1 thread; medians; CPU time is the figure to trust on this shared machine. "
        "Shim calls per run: served in C / sent to Python. The Python-shims arms run in "
        "rounds of their own with torch's runner (switching the process to the reference "
        "implementation slows the native arms' next run). Paired: the median of each "
        "round's CPU ratio (the arms of a round run back to back), beside the ratio of the "
        "medians the target is judged on.",
        "",
        "| case | arm | wall | CPU | CPU / torch | paired CPU / torch | wall / torch "
        "| shim calls (C / Python) | target (CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, arms in results.items():
        ref = arms["torch_aoti"]
        for arm, row in arms.items():
            cpu_ratio, wall_ratio = row["cpu_us"] / ref["cpu_us"], row["wall_us"] / ref["wall_us"]
            counts = row["counts"]
            calls = f"{counts[0]:.0f} / {counts[1]:.0f}" if counts else ""
            target = _target(case, arm)
            verdict = (
                ""
                if target is None
                else f"<= {target}: " + ("met" if cpu_ratio <= target else "**missed**")
            )
            paired = f"{row['paired']:.3f}" if row.get("paired") is not None else ""
            lines.append(
                f"| {case} | {arm} | {row['wall_us']:.1f} us | {row['cpu_us']:.1f} us | "
                f"{cpu_ratio:.3f} | {paired} | {wall_ratio:.3f} | {calls} | {verdict} |"
            )
    return "\n".join(lines)


def run_all(
    config: str,
    programs: Path | None,
    repeat: int,
    budget: float,
    threads: int,
    lm: bool,
    write_md: Path | None = None,
    command: str = "etmetal bench native",
    transformer_scale: int = 1,
) -> int:
    """The tiny model, the proxy model, the 4-layer transformer, then (``lm``) the LM's
    decode and prefill, each arm interleaved; prints as it goes, and (``write_md``) writes
    the section of the report."""
    from etmetal.bench.native_transformer import bench_transformer

    torch.set_num_threads(threads)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"native shims vs Python shims vs torch's AOTI runner ({threads} thread(s)), ")
    print("medians of interleaved runs, CPU time beside wall time:")
    with tempfile.TemporaryDirectory() as tmp:
        results = bench_tiny(repeat, budget, Path(tmp))
        results.update(bench_proxy(repeat, budget, Path(tmp)))
        results.update(bench_transformer(repeat, budget, Path(tmp), scale=transformer_scale))
        if lm:
            programs = programs or Path(tmp)
            programs.mkdir(parents=True, exist_ok=True)
            results.update(bench_lm(config, programs, repeat, budget))
    if write_md is not None:
        write_section(write_md, "native", render(results, command, started))
    return 0
