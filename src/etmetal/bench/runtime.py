"""``etmetal bench runtime``: one non-delegated ``.pte``, three ways to run it.

Arms, interleaved: ``stock`` = ``executorch.runtime`` (C++ runtime, portable kernels),
``etmetal`` = ``etmetal.runtime`` (the Python runtime over ATen kernels), ``eager`` =
the PyTorch module itself (the same ATen kernels: the floor). Both runtimes load the
same bytes; their outputs are checked against eager before timing.

Also the per-instruction cost of etmetal's execute loop: a program of many tiny
kernel calls, timed against eager making the same ATen calls, the difference divided
by the number of instructions.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from etmetal.bench import timing as bm
from etmetal.examples.bench import models
from etmetal.runtime.errors import EtmetalRuntimeError

MODELS = ("mlp", "cnn", "transformer")

TARGET_VS_STOCK = 0.1

TARGET_VS_EAGER = 1.5

TARGET_US_PER_INSTRUCTION = 5.0


def to_pte(module: nn.Module, inputs: tuple) -> tuple[bytes, int]:
    """A non-delegated ``.pte`` (portable kernels only) and its instruction count.

    Lowered with ``etmetal.backend_config()`` (the documented user path; its default
    keeps the program runnable by the stock kernels too)."""
    from executorch.exir import to_edge_transform_and_lower

    import etmetal

    ep = torch.export.export(module, inputs, strict=False)
    prog = to_edge_transform_and_lower(ep).to_executorch(etmetal.backend_config())
    n = sum(len(c.instructions) for c in prog.executorch_program.execution_plan[0].chains)
    return prog.buffer, n


def _load_stock(buffer: bytes):
    from executorch.runtime import Runtime

    return Runtime.get().load_program(buffer).load_method("forward")


def _load_etmetal(buffer: bytes):
    from etmetal.runtime import Runtime

    return Runtime.get().load_program(buffer).load_method("forward")


def _check(name: str, got: list, want: torch.Tensor, tol: float) -> float:
    if not isinstance(got, (list, tuple)) or len(got) != 1:
        raise SystemExit(f"bench runtime: {name} returned {type(got).__name__}, expected 1 output")
    err = (got[0] - want).abs().max().item()
    scale = max(1.0, want.abs().max().item())
    if not err <= tol * scale:
        raise SystemExit(f"bench runtime: {name} output differs from eager by {err:.3g}")
    return err


def bench_model(name: str, args: argparse.Namespace) -> bm.Comparison:
    spec = models(args.scale)[name]
    module, inputs = spec.make_module(), spec.make_inputs()
    with torch.no_grad():
        want = module(*inputs)
    buffer, n_instr = to_pte(module, inputs)
    stock = _load_stock(buffer)
    t0 = time.perf_counter()
    err_stock = _check("stock", stock.execute(list(inputs)), want, 1e-3)
    stock_s = time.perf_counter() - t0
    errs, etm_error = {"stock": err_stock}, None
    try:
        etm = _load_etmetal(buffer)
        errs["etmetal"] = _check("etmetal", etm.execute(list(inputs)), want, 1e-4)
    except EtmetalRuntimeError as exc:  # reported in the row; the other arms still run
        etm, etm_error = None, f"{type(exc).__name__}: {exc}"
        print(f"  {name}: etmetal.runtime cannot run this .pte: {etm_error}")

    def eager():
        with torch.no_grad():
            module(*inputs)

    # the stock runtime is ~100x slower: one stock call per round, and enough calls of the
    # fast arms that each of their samples spans about a quarter of a stock call
    eager()
    t0 = time.perf_counter()
    eager()
    fast = max(1, min(50, int(0.25 * stock_s / max(time.perf_counter() - t0, 1e-6))))
    arms = [bm.Arm("stock", lambda: stock.execute(list(inputs)), inner=1)]
    if etm is not None:
        arms.append(bm.Arm("etmetal", lambda: etm.execute(list(inputs)), inner=fast))
    arms.append(bm.Arm("eager", eager, inner=fast))
    timings = bm.interleaved(arms, repeat=args.repeat, warmup=1, budget_s=args.budget)
    row = bm.Comparison("runtime", name, timings)
    if etm is not None:
        row.add_ratio("etmetal", "stock", TARGET_VS_STOCK)
        row.add_ratio("etmetal", "eager", TARGET_VS_EAGER)
    row.extra.update(
        description=spec.description,
        instructions=n_instr,
        max_abs_err_vs_eager=errs,
        calls_per_sample={a.name: a.inner for a in arms},
    )
    if etm_error:
        row.extra["etmetal_error"] = etm_error
    return row


def _noop() -> None:
    return None


class OpChain(nn.Module):
    """``n`` cheap elementwise ops in a row: latency is the per-instruction cost."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n // 2):
            x = x + 1.0
            x = x * 0.5
        return x


def bench_loop_overhead(args: argparse.Namespace) -> bm.Comparison:
    module = OpChain(args.instructions)
    inputs = (torch.randn(1, 16),)
    buffer, n_instr = to_pte(module, inputs)
    stock, etm = _load_stock(buffer), _load_etmetal(buffer)
    want = module(*inputs)
    _check("stock", stock.execute(list(inputs)), want, 1e-5)
    _check("etmetal", etm.execute(list(inputs)), want, 1e-6)
    x = inputs[0]
    a, b = torch.empty_like(x), torch.empty_like(x)
    add, mul = torch.ops.aten.add.out, torch.ops.aten.mul.out

    def aten_calls():  # the same out-variant calls the program makes, from a Python loop
        src = x
        for _ in range(args.instructions // 2):
            add(src, 1.0, out=a)
            mul(a, 0.5, out=b)
            src = b

    # the same method with every kernel step replaced by a no-op: what is left is the
    # execute loop itself (plus the per-execute input copy and output clone)
    hollow = _load_etmetal(buffer)
    for chain in hollow._chains:  # private: the prepared steps of each chain
        chain.steps[:] = [_noop] * len(chain.steps)

    arms = [
        bm.Arm("stock", lambda: stock.execute(list(inputs))),
        bm.Arm("etmetal", lambda: etm.execute(list(inputs))),
        bm.Arm("aten_calls", aten_calls),
        bm.Arm("etmetal_noop_kernels", lambda: hollow.execute(list(inputs))),
    ]
    timings = bm.interleaved(arms, repeat=max(args.repeat, 30), warmup=3, inner=5)
    row = bm.Comparison("runtime", "loop_overhead", timings)
    per = {k: t.median_us / n_instr for k, t in timings.items()}
    overhead = timings["etmetal_noop_kernels"].median_us / n_instr
    pair = bm.paired_median_difference(timings["etmetal"], timings["aten_calls"])
    vs_python = pair * 1e6 / n_instr
    row.extra.update(
        description=f"{args.instructions} elementwise kernel calls on a 1x16 tensor",
        instructions=n_instr,
        us_per_instruction=per,
        etmetal_overhead_us_per_instruction=overhead,
        etmetal_minus_python_loop_us_per_instruction=vs_python,
        target_us_per_instruction=TARGET_US_PER_INSTRUCTION,
        met_us_per_instruction=per["etmetal"] < TARGET_US_PER_INSTRUCTION,
        met_overhead=overhead < TARGET_US_PER_INSTRUCTION,
    )
    return row
