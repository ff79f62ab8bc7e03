"""What the emulated Metal device costs, measured for ``etmetal bench metal``.

- :func:`bench_dispatch`: one trivial kernel (``out[i] = in[i] + 1``,
  ``metal_launch_kernel.metal``) launched N times through the shims from native code, as
  Inductor's Metal wrapper launches every kernel (``metal_launch_driver.cpp``: command
  block, encoding, arguments, dispatch), interleaved with the same dispatch made straight
  on the MSL executor's entry from native code (and, for reference, through its Python
  API). The difference is what the ``aoti_torch_mps_*`` layer adds per launch.
- :func:`bench_kernels`: each Metal kernel of a demo model lowered for ``mps_emulated``,
  timed per dispatch while the model runs (the shim's argument check plus the executor's
  run), with its grid and the kernels' share of the execute.
- :func:`bench_ratio`: a demo model lowered for ``host`` and for ``mps_emulated``, both
  ``.pte`` run by etmetal's runtime, interleaved with eager; the ratio is emulated/host.

Every output is checked against eager (or the exact result) before timing; a mismatch
raises ``SystemExit`` naming the model and the error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from etmetal.bench import timing as bm
from etmetal.common.targets import HOST, MPS_EMULATED

HERE = Path(__file__).parent
KERNEL_SOURCE = HERE / "metal_launch_kernel.metal"
DRIVER_SOURCE = HERE / "metal_launch_driver.cpp"
SHIM_CALLS_PER_LAUNCH = 6  # command block, start_encoding, 2 tensors, 1 int, dispatch


# --- the trivial kernel ---------------------------------------------------------------------


def _driver(name: str = "etm_bench_metal_launch"):
    from etmetal.common.native_build import build_sources
    from etmetal.shims import load_bridge

    # linked to the bridge by path, like a model's wrapper: the bridge is RTLD_LOCAL
    so = build_sources(
        "bench-metal",
        "libetmetal_bench_metal.so",
        [DRIVER_SOURCE],
        lang="c++",
        flags=("-O2", "-std=c++17"),
        link=("-Wl,--no-as-needed", str(load_bridge().path)),
    )
    lib = ctypes.PyDLL(str(so), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    fn = getattr(lib, name)
    fn.restype = ctypes.c_double
    if name == "etm_bench_metal_launch":
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
    else:
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64]
    fn.argtypes += [ctypes.c_void_p] if name == "etm_bench_metal_launch" else [ctypes.c_int64] * 2
    return fn


def bench_dispatch(launches: int, n: int, repeat: int) -> bm.Comparison:
    from etmetal.shims import default_context
    from etmetal.shims.emulated_mps import compile_library
    from etmetal.shims.emulated_mps.native_launch import dispatches

    source = KERNEL_SOURCE.read_text()
    launch = _driver()
    result = torch.full((n,), float("nan"))
    if launch(source.encode(), b"add_one", n, 1, result.data_ptr()) < 0:
        raise SystemExit(f"bench metal: a shim call failed: {_shim_error()}")
    if not torch.equal(result, torch.arange(n, dtype=torch.float32) + 1):
        raise SystemExit("bench metal: the trivial kernel's result through the shims is wrong")

    fn = compile_library(source).function("add_one")
    x, out = torch.arange(n, dtype=torch.float32), torch.full((n,), float("nan"))
    count = ctypes.c_int64(n)
    args = {0: out.data_ptr(), 1: x.data_ptr(), 2: ctypes.addressof(count)}
    group = (min(n, 1024),)  # what the shims pick for dispatch_single
    fn.dispatch(args, (n,), group)
    if not torch.equal(out, x + 1):
        raise SystemExit("bench metal: the trivial kernel's result on the executor is wrong")

    def executor_from_python() -> None:
        for _ in range(launches):
            fn.dispatch(args, (n,), group)

    # the executor's own entry called from native code, as the shims call it: the fair base
    direct = _driver("etm_bench_metal_executor")
    slots = (ctypes.c_void_p * 3)(args[0], args[1], args[2])
    entry, run = fn._entry, ctypes.cast(fn._dispatch, ctypes.c_void_p).value
    loop = fn._loop  # the kernel's loop entry: it never synchronises
    out.fill_(float("nan"))
    if direct(run, entry, loop, slots, n, group[0], 1) < 0 or not torch.equal(out, x + 1):
        raise SystemExit("bench metal: the executor called from native code failed")

    before = dispatches(default_context())
    arms = [
        bm.Arm(
            "shims", lambda: launch(source.encode(), b"add_one", n, launches, result.data_ptr())
        ),
        bm.Arm("executor", lambda: direct(run, entry, loop, slots, n, group[0], launches)),
        bm.Arm("executor_from_python", executor_from_python),
    ]
    raw = bm.interleaved(arms, repeat=repeat, warmup=1)
    if dispatches(default_context()) == before:
        raise SystemExit("bench metal: the driver's launches did not reach etmetal's shims")
    # per launch: each sample made `launches` launches
    timings = {
        k: bm.Timing(k, t.median_s / launches, t.min_s / launches, t.samples)
        for k, t in raw.items()
    }
    row = bm.Comparison("metal", "dispatch", timings)
    row.add_ratio("shims", "executor")
    row.extra.update(
        description=f"trivial kernel, {n} threads, {launches} launches per sample",
        launches_per_sample=launches,
        threads=n,
        shim_layer_us=(timings["shims"].median_s - timings["executor"].median_s) * 1e6,
        shim_calls_per_launch=SHIM_CALLS_PER_LAUNCH,
    )
    return row


def _shim_error() -> str:
    from etmetal.shims import last_error

    return last_error() or "(no message)"


# --- a real model's kernels -----------------------------------------------------------------


def _lower(name: str, target: str, out_dir: Path):
    """The demo model lowered for ``target``, loaded by etmetal's runtime: (method, module)."""
    from etmetal.backend.lowering import lower
    from etmetal.examples.demo import get_demo
    from etmetal.runtime import Runtime

    module, inputs = get_demo(name)
    program, _ = lower(module, inputs, target=target)
    path = out_dir / f"{name}-{target}.pte"
    path.write_bytes(program.buffer)
    # built by this process from the model above: trusting its native code is the point
    return Runtime.get().load_program(path, trust_native_code=True).load_method("forward"), module


def _check(name: str, label: str, got: torch.Tensor, want: torch.Tensor) -> float:
    from etmetal.examples.demo import DEMO_MODELS_BY_NAME

    spec = DEMO_MODELS_BY_NAME[name]
    err = (got - want).abs().max().item()
    if got.shape != want.shape or not torch.allclose(got, want, atol=spec.atol, rtol=spec.rtol):
        raise SystemExit(f"bench metal: {name} ({label}) differs from eager: max abs error {err:g}")
    return err


def _kernel_hint(source: str | None) -> str:
    """What a generated kernel does, from its MSL: its threadgroup reductions and math."""
    if source is None:
        return ""
    body = source[source.rfind("kernel void") :]
    reductions = sorted(set(re.findall(r"threadgroup_(\w+)\(", body)))
    math = sorted(
        name
        for name in set(re.findall(r"metal::(?:precise::)?(\w+)\(", body))
        if not name.startswith("threadgroup_") and name not in ("max", "min")
    )
    parts = [f"threadgroup {', '.join(reductions)}"] if reductions else []
    if math:
        parts.append(", ".join(math))
    return "; ".join(parts) or "elementwise"


@contextlib.contextmanager
def _timed_dispatches(times: dict[int, list[float]], grids: dict[int, tuple]) -> Iterator[dict]:
    """Time every kernel dispatch of the emulated device, keyed by kernel function handle,
    and remember each library's MSL source (keyed by the compiled library's id). The
    launches go through the Python shims meanwhile (the C path has no timing hook), so
    the execute timed beside them includes the Python launch overhead."""
    from etmetal.shims import default_context
    from etmetal.shims.emulated_mps import mps_kernels, msl
    from etmetal.shims.emulated_mps.native_launch import set_native_launch

    sources: dict[int, str] = {}
    dispatch, compile_library = mps_kernels._dispatch, msl.compile_library

    def compile_recorded(source: str):
        lib = compile_library(source)
        sources[id(lib)] = source
        return lib

    def dispatch_timed(ctx, fn, threads, group):
        t0 = time.perf_counter()
        dispatch(ctx, fn, threads, group)
        times.setdefault(fn.handle, []).append(time.perf_counter() - t0)
        grids[fn.handle] = (tuple(threads), tuple(group), fn.library)

    mps_kernels._dispatch, msl.compile_library = dispatch_timed, compile_recorded
    native = set_native_launch(default_context(), False)
    try:
        yield sources
    finally:
        set_native_launch(default_context(), native)
        mps_kernels._dispatch, msl.compile_library = dispatch, compile_library


# the arms and errors of these rows are named for the targets they run
HOST_NAME, EMULATED = HOST.name, MPS_EMULATED.name


def bench_kernels(name: str, runs: int, tmp: Path) -> bm.Comparison:
    from etmetal.examples.demo import DEMO_MODELS_BY_NAME
    from etmetal.shims import default_context
    from etmetal.shims.emulated_mps.mps_device import mps_state

    spec = DEMO_MODELS_BY_NAME[name]
    xs = list(spec.make_inputs(torch.Generator().manual_seed(1)))
    times: dict[int, list[float]] = {}
    grids: dict[int, tuple] = {}
    with _timed_dispatches(times, grids) as sources:
        method, module = _lower(name, EMULATED, tmp)
        with torch.no_grad():
            want = module(*xs)
        _check(name, EMULATED, method.execute(xs)[0], want)
        for v in times.values():
            v.clear()  # the first execute creates the libraries: not a steady launch
        run_s = []
        for _ in range(runs):
            t0 = time.perf_counter()
            method.execute(xs)
            run_s.append(time.perf_counter() - t0)
    libraries = mps_state(default_context()).libraries
    rows = []
    for order, (handle, samples) in enumerate(times.items()):
        threads, group, lib_handle = grids[handle]
        lib = libraries.get(lib_handle)
        per_run = len(samples) / runs
        rows.append(
            {
                "kernel": order,
                "grid": list(threads),
                "threadgroup": list(group),
                "dispatches_per_run": per_run,
                "median_us": statistics.median(samples) * 1e6,
                "does": _kernel_hint(sources.get(id(lib.compiled)) if lib else None),
            }
        )
    method.destroy()
    run_us = statistics.median(run_s) * 1e6
    kernel_us = sum(r["median_us"] * r["dispatches_per_run"] for r in rows)
    row = bm.Comparison(
        "metal",
        f"kernels_{name}",
        {"execute": bm.Timing("execute", run_us * 1e-6, min(run_s), runs)},
    )
    row.extra.update(
        description=f"{name}'s Metal kernels, {runs} executes (launches through Python)",
        model=name,
        kernels=rows,
        kernel_us_per_execute=kernel_us,
        kernel_share=kernel_us / run_us,
    )
    return row


# --- emulated vs host -----------------------------------------------------------------------


RATIO_AT_MOST = 2.0  # issue 27: mps_emulated/host on the demo models and an LM decode step


def _cpu_counted(arms: list[bm.Arm]) -> tuple[list[bm.Arm], dict[str, list[float]]]:
    """The arms, each call also adding its process CPU time (user + system, every OS thread
    of the process: the device's pool included) to its total: name -> [seconds, calls]."""
    totals: dict[str, list[float]] = {a.name: [0.0, 0] for a in arms}

    def counted(fn, acc):
        def run():
            c0 = time.process_time()
            fn()
            acc[0] += time.process_time() - c0
            acc[1] += 1

        return run

    return [bm.Arm(a.name, counted(a.fn, totals[a.name]), a.inner) for a in arms], totals


def _ratio_row(case: str, arms: list[bm.Arm], repeat: int, budget_s: float, **extra):
    """The arms interleaved (wall medians, CPU means); the row's ratio is emulated/host."""
    arms, cpu = _cpu_counted(arms)
    inner = bm.calibrate_inner(arms[0].fn, target_s=2e-3, cap=50)
    timings = bm.interleaved(arms, repeat=repeat, warmup=2, inner=inner, budget_s=budget_s)
    row = bm.Comparison("metal", case, timings)
    # issue 27's target, said beside the table (not a targets-table entry: this section is
    # regenerated on its own, `bench all --update-md`)
    ratio = row.add_ratio(EMULATED, HOST_NAME)
    cpu_us = {k: s / n * 1e6 for k, (s, n) in cpu.items() if n}
    row.extra.update(
        calls_per_sample=inner,
        # best-of ratio too: on a loaded machine preemption inflates medians unevenly
        best_ratio=timings[EMULATED].min_s / timings[HOST_NAME].min_s,
        cpu_us=cpu_us,
        cpu_ratio=cpu_us[EMULATED] / cpu_us[HOST_NAME],
        target_at_most=RATIO_AT_MOST,
        target_met=ratio <= RATIO_AT_MOST,
        **extra,
    )
    return row


def bench_ratio(name: str, tmp: Path, repeat: int, budget_s: float) -> bm.Comparison:
    from etmetal.examples.demo import DEMO_MODELS_BY_NAME

    spec = DEMO_MODELS_BY_NAME[name]
    xs = list(spec.make_inputs(torch.Generator().manual_seed(1)))
    host, module = _lower(name, HOST_NAME, tmp)
    emulated, _ = _lower(name, EMULATED, tmp)
    with torch.no_grad():
        want = module(*xs)
    errs = {
        HOST_NAME: _check(name, HOST_NAME, host.execute(xs)[0], want),
        EMULATED: _check(name, EMULATED, emulated.execute(xs)[0], want),
    }

    def eager() -> None:
        with torch.no_grad():
            module(*xs)

    arms = [
        bm.Arm(HOST_NAME, lambda: host.execute(xs)),
        bm.Arm(EMULATED, lambda: emulated.execute(xs)),
        bm.Arm("eager", eager),
    ]
    row = _ratio_row(
        name, arms, repeat, budget_s, description=spec.description, max_abs_err_vs_eager=errs
    )
    host.destroy()
    emulated.destroy()
    return row


LM_CONFIG = "tiny"  # the two-method example LM of the tests (etmetal.examples.llm)
LM_CASE = "lm_decode"


def bench_lm_decode(tmp: Path, repeat: int, budget_s: float) -> bm.Comparison:
    """One decode step of the two-method example LM (``prefill`` + ``decode``) lowered for
    ``host`` and for ``mps_emulated``: the step at position PROMPT, checked against eager's
    before timing. ``mps_emulated`` (upstream's runtime layout) cannot share the KV cache
    between the methods, so every arm decodes over its own cache as exported (zeros); the
    step writes the same entries each time, so every call computes the same."""
    from etmetal.bench.llm import PROMPT
    from etmetal.examples import llm
    from etmetal.runtime import Runtime

    model = llm.make_decoder_lm(llm.CONFIGS[LM_CONFIG])
    step = [torch.tensor([[7]]), torch.tensor([PROMPT])]
    methods, errs = {}, {}
    for target in (HOST_NAME, EMULATED):
        program = llm.lower_methods(llm.lm_exports(model, prompt_len=PROMPT), target=target)
        path = tmp / f"lm-{LM_CONFIG}-{target}.pte"
        path.write_bytes(program.buffer)
        # built by this process from the model above: trusting its native code is the point
        loaded = Runtime.get().load_program(path, trust_native_code=True)
        methods[target] = (loaded, loaded.load_method("decode"))
    with torch.no_grad():  # after the exports: the eager model's cache as they captured it
        want = model(*step)
    for target, (_, decode) in methods.items():
        got = decode.execute(step)[0]
        errs[target] = (got - want).abs().max().item()
        if got.shape != want.shape or errs[target] > 1e-3 * max(1.0, want.abs().max().item()):
            raise SystemExit(
                f"bench metal: the LM decode step ({target}) differs from eager: "
                f"max abs error {errs[target]:g}"
            )

    def eager() -> None:
        with torch.no_grad():
            model(*step)

    arms = [
        bm.Arm(HOST_NAME, lambda: methods[HOST_NAME][1].execute(step)),
        bm.Arm(EMULATED, lambda: methods[EMULATED][1].execute(step)),
        bm.Arm("eager", eager),
    ]
    cfg = model.cfg
    row = _ratio_row(
        LM_CASE,
        arms,
        repeat,
        budget_s,
        description=(
            f"one decode step of the two-method example LM ({LM_CONFIG}: {cfg.layers} layer, "
            f"dim {cfg.dim}, {cfg.heads} heads, vocab {cfg.vocab}) at position {PROMPT}"
        ),
        max_abs_err_vs_eager=errs,
    )
    for _, decode in methods.values():
        decode.destroy()
    return row
