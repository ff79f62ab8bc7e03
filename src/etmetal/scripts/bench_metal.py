"""``etmetal bench metal``: what the emulated Metal device costs (kernel launch overhead,
a demo model's kernels one by one, emulated/host time of the demo models, the cold
compile of one emulated partition); the
measurements are :mod:`etmetal.bench.metal`'s. Speed is not the emulated
target's purpose: these numbers say what a CI run pays for it."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from etmetal.bench import timing as bm

MODELS = ("transformer_block", "patch_embedding", "lm_decode")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # short samples on a shared machine: many rounds for a stable median
    bm.add_common_arguments(parser, repeat=60, models=MODELS)
    parser.add_argument("--launches", type=int, default=200, help="kernel launches per sample")
    parser.add_argument("--elements", type=int, default=256, help="trivial kernel's threads")
    parser.add_argument(
        "--kernel-runs", type=int, default=20, help="model executes timed per kernel"
    )
    parser.add_argument(
        "--cold-compiles",
        type=int,
        default=1,
        help="cold compile samples of one emulated partition (each arm; 0 = skip)",
    )


def collect(args: argparse.Namespace) -> dict[str, Any]:
    from etmetal.backend.mps_emulated_compile import host_can_compile
    from etmetal.bench import metal as mb

    torch.set_num_threads(args.threads)
    ok, why = host_can_compile()
    if not ok:
        raise SystemExit(f"bench metal: this host cannot build the mps_emulated target: {why}")
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise SystemExit(f"bench metal: unknown model(s) {unknown}; choose from {MODELS}")
    rows = [mb.bench_dispatch(args.launches, args.elements, args.repeat)]
    d = rows[0]
    print(
        f"trivial kernel launch ({args.elements} threads): through the shims "
        f"{d.timings['shims'].median_us:.1f} us, executor alone "
        f"{d.timings['executor'].median_us:.1f} us (shim layer "
        f"{d.extra['shim_layer_us']:.1f} us)"
    )
    with tempfile.TemporaryDirectory(prefix="etmetal-bench-") as tmp:
        for name in names:
            if name == mb.LM_CASE:
                continue  # its kernels are not a demo model's
            row = mb.bench_kernels(name, args.kernel_runs, Path(tmp))
            rows.append(row)
            e = row.extra
            print(
                f"{name}: {len(e['kernels'])} Metal kernel(s), "
                f"{e['kernel_us_per_execute']:.0f} us of a {row.timings['execute'].median_us:.0f}"
                f" us execute"
            )
            for k in e["kernels"]:
                print(
                    f"  kernel {k['kernel']}: grid {k['grid']} group {k['threadgroup']}: "
                    f"{k['median_us']:.1f} us x {k['dispatches_per_run']:g}  {k['does']}"
                )
        for name in names:
            if name == mb.LM_CASE:
                rows.append(mb.bench_lm_decode(Path(tmp), args.repeat, args.budget))
            else:
                rows.append(mb.bench_ratio(name, Path(tmp), args.repeat, args.budget))
            bm.print_comparison(rows[-1])
            cpu = rows[-1].extra["cpu_us"]
            print(
                "                   CPU per call: "
                + "  ".join(f"{k} {v:.1f} us" for k, v in cpu.items())
                + f"  (mps_emulated/host {rows[-1].extra['cpu_ratio']:.3f})"
            )
            e = rows[-1].extra
            print(
                f"                   issue 27's target mps_emulated/host <= {e['target_at_most']}: "
                + ("met" if e["target_met"] else "MISSED")
            )
    demos = [m for m in names if m != mb.LM_CASE]
    if args.cold_compiles > 0 and demos:
        from etmetal.bench.cold_compile import bench_cold_compile

        rows.append(bench_cold_compile(demos[0], args.cold_compiles))
        e = rows[-1].extra
        print(
            f"cold compile of one mps_emulated partition ({demos[0]}): "
            + "  ".join(
                f"{k} {e['wall_s'][k]:.1f} s wall / {e['cpu_s'][k]:.1f} s CPU" for k in e["wall_s"]
            )
        )
    return bm.emit(args, "metal", rows)
