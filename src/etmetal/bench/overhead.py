"""``etmetal bench overhead``: ns per shim call, and copy bandwidth of views vs a plain copy.

- Shim calls are timed from native code (the C driver of ``bench shims``).
- ``view_copy``: etmetal's ``aten::view_copy.out`` kernel flattening a default-order
  input (one flat copy) and a channels-last one (the layout the stock portable kernel
  rejects; logical order then differs from memory order, so the copy is a transpose),
  timed against a contiguous copy of the same bytes.
- Gather: the packed copy a fallback op gets of a shim view with holes (``chunk``).
Arms are interleaved; the ratio is contiguous-copy time / arm time (bandwidth ratio).
"""

from __future__ import annotations

import torch

from etmetal.bench import timing as bm

TARGET_BANDWIDTH_RATIO = 0.5

TARGET_SHIM_NS = 2000.0


def bench_copies(mib: float, repeat: int) -> bm.Comparison:
    from etmetal.runtime.kernels.view_copy import view_copy
    from etmetal.shims.storage import Storage, Tensor

    n = int(mib * (1 << 20)) // 4
    c = 32  # channels; the rest is spatial (channels-last [1, C, H, W])
    hw = max(1, n // c)
    h = max(1, int(hw**0.5))
    w = hw // h
    n = c * h * w
    src, dst = torch.randn(n), torch.empty(n)
    cl = torch.randn(1, c, h, w).to(memory_format=torch.channels_last)
    cl_out = torch.empty(1, n)
    flat_in, flat_out = torch.randn(1, c, h, w), torch.empty(1, n)
    run = 64  # gather: half of each 2*64-float row, 256-byte runs
    rows_ = n // run
    n_g = rows_ * run
    buf = torch.randn(rows_ * 2 * run)
    view = Tensor(Storage.borrow_tensor(buf), 6, (rows_, run), (2 * run, 1), run).torch()
    g_out = torch.empty(rows_, run)
    arms = [
        bm.Arm("contiguous_copy", lambda: dst.copy_(src)),
        bm.Arm("view_copy_contiguous", lambda: view_copy(flat_in, [1, n], flat_out)),
        bm.Arm("view_copy_channels_last", lambda: view_copy(cl, [1, n], cl_out)),
        bm.Arm("gather_chunk", lambda: g_out.copy_(view)),
    ]
    timings = bm.interleaved(arms, repeat=repeat, warmup=2, inner=3)
    if not (torch.equal(cl_out, cl.reshape(1, n)) and torch.equal(flat_out, flat_in.reshape(1, n))):
        raise SystemExit("bench overhead: view_copy result differs from reshape")
    if not torch.equal(g_out, buf.view(rows_, 2 * run)[:, run:]):
        raise SystemExit("bench overhead: gather result differs from the strided view")
    row = bm.Comparison("overhead", f"copy_{mib:g}MiB", timings)
    nbytes = {k: n * 4 for k in timings}
    nbytes["gather_chunk"] = n_g * 4
    bw = {k: nbytes[k] / t.median_s / 1e9 for k, t in timings.items()}
    ratios = {k: bw[k] / bw["contiguous_copy"] for k in bw if k != "contiguous_copy"}
    row.extra.update(
        bytes=nbytes,
        gb_per_s=bw,
        bandwidth_ratio=ratios,
        target_bandwidth_ratio_at_least=TARGET_BANDWIDTH_RATIO,
        met={k: r >= TARGET_BANDWIDTH_RATIO for k, r in ratios.items()},
    )
    return row


def bench_shim_calls(calls: int) -> bm.Comparison:
    from etmetal.bench.shims import bench_calls

    ns = bench_calls(calls)
    timings = {k: bm.Timing(k, v * 1e-9, v * 1e-9, 3) for k, v in ns.items()}
    row = bm.Comparison("overhead", "shim_calls", timings)
    row.extra.update(
        ns_per_call=ns,
        target_ns_at_most=TARGET_SHIM_NS,
        met={k: v < TARGET_SHIM_NS for k, v in ns.items()},
        note="best of 3 loops, timed in C; pairs (alloc + delete) count as 2 calls",
    )
    return row
