"""``etmetal bench overhead``: its arguments, and the printing of what
:mod:`etmetal.bench.overhead` measures."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from etmetal.bench import overhead as ob
from etmetal.bench import timing as bm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # memory-bound copies on a shared machine: many short rounds for a stable median
    bm.add_common_arguments(parser, repeat=30)
    parser.add_argument("--sizes-mib", default="1,4,16", help="copy sizes in MiB")
    parser.add_argument("--calls", type=int, default=20000, help="shim calls per pattern")


def collect(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    rows = [ob.bench_shim_calls(args.calls)]
    print("ns per shim call, called from native code (target < 2000 ns):")
    for k, v in rows[0].extra["ns_per_call"].items():
        print(f"  {k:48s} {v:8.0f} ns  {'met' if v < ob.TARGET_SHIM_NS else 'MISSED'}")
    print("copy bandwidth vs a contiguous copy of the same bytes (target >= 0.5):")
    for mib in (float(s) for s in args.sizes_mib.split(",")):
        row = ob.bench_copies(mib, args.repeat)
        rows.append(row)
        e = row.extra
        for k, gbs in e["gb_per_s"].items():
            r = e["bandwidth_ratio"].get(k)
            tail = "" if r is None else f"  ratio {r:5.2f} {'met' if r >= 0.5 else 'MISSED'}"
            print(f"  {mib:5g} MiB  {k:26s} {gbs:7.2f} GB/s{tail}")
    return bm.emit(args, "overhead", rows)
