"""``etmetal bench shims``: its arguments, and the printing of what
:mod:`etmetal.bench.shims` measures."""

from __future__ import annotations

import argparse

import torch

from etmetal.bench import shims as sb


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=20000, help="calls per pattern")
    parser.add_argument("--runs", type=int, default=300, help="model runs per strided-view model")
    parser.add_argument("--no-models", action="store_true", help="skip the compiled models")
    parser.add_argument("--sizes-mib", default="1,4,16", help="gather sizes in MiB")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads (default 1: OpenMP workers spinning on a shared machine distort timings)",
    )


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print(f"\nns per shim call, called from native code ({args.calls} calls, best of 3):")
    for name, ns in sb.bench_calls(args.calls).items():
        print(f"  {name:48s} {ns:9.0f} ns/call")
    if not args.no_models:
        print(f"\nstrided-view models through the bridge ({args.runs} runs):")
        for name, us, calls in sb.bench_models(args.runs):
            print(f"  {name:28s} {us:8.1f} us/run  {calls:5.1f} shim calls/run")
    print(
        "\nstrided gather (packed copy of a view with holes) vs contiguous copy of the same bytes:"
    )
    below = []
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        for name, gbs, ratio in sb.bench_gather(mib):
            flag = "" if name == "contiguous copy" else ("  ok" if ratio >= 0.5 else "  BELOW 0.5")
            if flag == "  BELOW 0.5":
                below.append(f"{mib} MiB {name}")
            print(f"  {mib:3d} MiB  {name:38s} {gbs:7.2f} GB/s  ratio {ratio:5.2f}{flag}")
    print("\ntarget (gather >= 0.5 of contiguous copy, 1 MiB and larger):", end=" ")
    print("met" if not below else f"NOT met for {', '.join(below)}")
    return 0
