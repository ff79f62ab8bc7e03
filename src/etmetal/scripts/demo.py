"""``etmetal demo``: the main job, end to end.

For each demo model (a transformer block with RoPE via split halves, and a channels-last
patch embedding): export, lower with ``MetalPartitioner()`` for this host, save the
``.pte``, load it in etmetal's runtime (the MetalBackend delegate runs the AOTI ``.so``
through etmetal's shims), compare with eager PyTorch and time both. AOTI compiles report
progress while they run (cached afterwards). Then the ``view_copy`` layout table: the stock
lowering vs ``etmetal.backend_config()`` on ExecuTorch's own runtime.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from etmetal.bench.timing import Arm, interleaved
from etmetal.common.targets import AUTO, CHOICES, MPS_EMULATED
from etmetal.scripts.suites import add_only_option
from etmetal.testing import view_copy_matrix


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_only_option(parser, "--model", "only this demo model (repeatable); default: all")
    parser.add_argument(
        "--out-dir", default="etmetal-demo", help="where the .pte files go (default: %(default)s)"
    )
    parser.add_argument("--runs", type=int, default=50, help="timed executes per model")
    parser.add_argument(
        "--target",
        choices=CHOICES,
        default=AUTO,
        help="Metal target to lower for (default: %(default)s; mps_emulated = Inductor's real "
        "Metal code run on etmetal's emulated Metal device)",
    )
    add_only_option(parser, "--case", "only this view_copy model (repeatable); default: all")
    parser.add_argument(
        "--no-view-copy", action="store_true", help="skip the view_copy layout table"
    )


@dataclass
class DemoResult:
    name: str
    ok: bool
    max_abs_error: float = float("nan")
    lower_s: float = 0.0
    load_s: float = 0.0
    etmetal_ms: float = float("nan")
    eager_ms: float = float("nan")
    error: str = ""


def demo_model(name: str, out_dir: Path, runs: int, target: str = "auto") -> DemoResult:
    from etmetal.backend.aoti_compile import compile_stats
    from etmetal.backend.lowering import lower
    from etmetal.examples.demo import DEMO_MODELS_BY_NAME, get_demo
    from etmetal.runtime import Runtime

    spec = DEMO_MODELS_BY_NAME[name]
    print(f"\n== {name}: {spec.description}", flush=True)
    module, inputs = get_demo(name)
    before = compile_stats()
    start = time.perf_counter()
    program, partitioner = lower(module, inputs, target=target)
    lower_s = time.perf_counter() - start
    after = compile_stats()
    compiled = after["compiles"] - before["compiles"]
    hits = after["cache_hits"] - before["cache_hits"]
    for report in partitioner.reports:
        print(report.text())
    path = out_dir / f"{name}.pte"
    path.write_bytes(program.buffer)
    print(
        f"lowered for target {partitioner.target} in {lower_s:.1f} s "
        f"({compiled} AOTI compile(s), {hits} cache hit(s)); wrote {path} "
        f"({path.stat().st_size / 1024:.0f} KiB)"
    )
    start = time.perf_counter()
    # this process just built the .so from the model above: trusting it is the point
    method = Runtime.get().load_program(path, trust_native_code=True).load_method("forward")
    load_s = time.perf_counter() - start
    try:
        fresh = spec.make_inputs(torch.Generator().manual_seed(1))  # not the traced values
        with torch.no_grad():
            expected = module(*fresh)
        [got] = method.execute(list(fresh))
        err = (got - expected).abs().max().item()
        ok = got.shape == expected.shape and torch.allclose(
            got, expected, atol=spec.atol, rtol=spec.rtol
        )
        print(
            f"etmetal runtime vs eager: output {list(got.shape)}, max abs error {err:.3g} "
            f"(tolerance atol {spec.atol:g}, rtol {spec.rtol:g}): {'OK' if ok else 'MISMATCH'}"
        )
        xs = list(fresh)

        def eager() -> None:
            with torch.no_grad():
                module(*xs)

        timed = interleaved(
            [Arm("etmetal", lambda: method.execute(xs)), Arm("eager", eager)], repeat=runs, warmup=3
        )
        et_ms, eager_ms = (timed[k].median_s * 1e3 for k in ("etmetal", "eager"))
        print(
            f"latency (median of {runs}, interleaved): etmetal {et_ms:.3f} ms, "
            f"eager PyTorch {eager_ms:.3f} ms; load {load_s * 1e3:.0f} ms"
        )
    finally:
        method.destroy()
    return DemoResult(name, ok, err, lower_s, load_s, et_ms, eager_ms)


def view_copy_section(case_names: list[str] | None = None) -> tuple[str, bool]:
    """The view_copy section's text and whether every etmetal row was exact."""
    from etmetal.examples.view_copy import CASES, get_case

    cases = [get_case(name) for name in case_names] if case_names else CASES
    rows = view_copy_matrix.run_matrix(cases)
    text = "\n".join(
        [
            "view_copy on channels-last and other layouts, run with executorch.runtime",
            "(stock = ExecutorchBackendConfig(...), etmetal = etmetal.backend_config(...)):",
            "",
            view_copy_matrix.format_table(rows),
            "",
            view_copy_matrix.summary(rows),
        ]
    )
    ok = all(row.exact for row in rows if row.lowering == "etmetal")
    return text, ok


def summary_table(results: list[DemoResult]) -> str:
    lines = [
        f"{'model':20} {'result':9} {'max err':>9} {'lower s':>8} {'etmetal ms':>11} {'eager ms':>9}"
    ]
    for r in results:
        status = "OK" if r.ok else ("ERROR" if r.error else "MISMATCH")
        lines.append(
            f"{r.name:20} {status:9} {r.max_abs_error:9.2g} {r.lower_s:8.1f} "
            f"{r.etmetal_ms:11.3f} {r.eager_ms:9.3f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from etmetal.examples.demo import DEMO_MODELS, DEMO_MODELS_BY_NAME

    names = args.model or [m.name for m in DEMO_MODELS]
    unknown = [n for n in names if n not in DEMO_MODELS_BY_NAME]
    if unknown:
        print(f"unknown demo model(s) {unknown}; choose from {', '.join(DEMO_MODELS_BY_NAME)}")
        return 2
    if args.target == MPS_EMULATED.name:
        from etmetal.backend.mps_emulated_compile import host_can_compile
        from etmetal.scripts.doctor import mps_emulated_run

        for what, (ok, why) in (("build", host_can_compile()), ("run", mps_emulated_run())):
            if not ok:
                print(f"etmetal demo --target mps_emulated: this host cannot {what} it: {why}")
                return 2
    # AOTI compile progress (a tqdm counter on a terminal, else a line every few seconds)
    logging.basicConfig(format="%(message)s", stream=sys.stderr)
    logging.getLogger("etmetal.backend.aoti_compile").setLevel(logging.INFO)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        try:
            results.append(demo_model(name, out_dir, max(args.runs, 1), args.target))
        except Exception as exc:  # report and go on with the next model
            print(f"{name} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            results.append(DemoResult(name, False, error=f"{type(exc).__name__}: {exc}"))
    print("\n" + summary_table(results))
    ok = all(r.ok for r in results)
    if not args.no_view_copy:
        try:
            text, view_ok = view_copy_section(args.case)
        except KeyError as exc:
            print(exc.args[0])
            return 2
        print("\n" + text)
        ok = ok and view_ok
    return 0 if ok else 1
