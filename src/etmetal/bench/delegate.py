"""``etmetal bench delegate``: the same AOTI kernels run by torch's runner and by etmetal.

One model is compiled by AOTInductor twice from the same ExportedProgram: with
``link_libtorch=True`` for torch's own runner (``AOTIModelContainerRunnerCpu``, shims
in libtorch) and with ``link_libtorch=False`` for etmetal (shims through its bridge).
The generated kernels are the same; what differs is the runner and the shim layer.
Both load the weights from the same kind of blob. Arms, interleaved:

- ``torch_aoti``: torch's runner, ``runner.run(inputs)``
- ``etmetal_shims``: ``etmetal.shims.AotiModel.run(inputs)``
- ``etmetal_delegate`` (when the runtime delegate is available): the model lowered
  with ``MetalPartitioner`` to a ``.pte`` and run by ``etmetal.runtime``, the full path.
- ``stock_delegate``: the same ``.pte`` run by ExecuTorch's own runtime
  (``executorch.runtime``) with etmetal's native MetalBackend (``etmetal.stock_runtime``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from etmetal.bench import timing as bm
from etmetal.examples.bench import models

MODELS = ("tiny", "transformer")

TARGETS = {"tiny": 3.0, "transformer": 1.10}


def torch_runner(so_path: Path, weights_path: Path):
    """torch's own AOTI runner over a ``link_libtorch=True`` build, weights from the blob.

    etmetal's bridge stays out of the global symbol scope, so this works whether or not
    etmetal has loaded models in this process already.
    """
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(so_path), 1)
    if weights_path.stat().st_size:  # a model without constants has an empty blob
        runner.update_constant_buffer_from_blob(str(weights_path))
    return runner


def delegate_method(module: torch.nn.Module, inputs: tuple, tmp: Path):
    """The model lowered to the Metal delegate (host target) and loaded by etmetal.runtime,
    or None when this build has no runtime delegate for it."""
    from executorch.exir import to_edge_transform_and_lower

    import etmetal
    from etmetal.runtime import Runtime
    from etmetal.runtime.delegates import lookup_delegate

    if lookup_delegate("MetalBackend") is None:  # no delegate in this build yet
        return None, None
    ep = torch.export.export(module, inputs, strict=False)
    prog = to_edge_transform_and_lower(ep, partitioner=[etmetal.MetalPartitioner()])
    et = prog.to_executorch(etmetal.backend_config())
    path = tmp / "model.pte"
    with open(path, "wb") as f:
        et.write_to_file(f)
    program = Runtime.get().load_program(str(path), trust_native_code=True)
    n_delegates = sum(
        1
        for c in et.executorch_program.execution_plan[0].chains
        for i in c.instructions
        if type(i.instr_args).__name__ == "DelegateCall"
    )
    return program.load_method("forward"), n_delegates


def stock_method(pte: Path):
    """The ``.pte`` loaded by the stock runtime with etmetal's native backend registered
    (this process trusts the bench's own programs)."""
    from executorch.runtime import Runtime

    from etmetal import stock_runtime

    stock_runtime.register(trust_native_code=True)
    return Runtime.get().load_program(str(pte)).load_method("forward")


@dataclass
class _Prepared:
    name: str
    description: str
    module: torch.nn.Module
    inputs: list
    want: torch.Tensor
    etmetal_artifact: Any
    runner: Any


def prepare(name: str, args: argparse.Namespace) -> _Prepared:
    """Compile both builds and create torch's runner."""
    from etmetal.backend.aoti_compile import compile_exported_program

    spec = models(args.scale)[name]
    module, inputs = spec.make_module(), spec.make_inputs()
    with torch.no_grad():
        want = module(*inputs)
    ep = torch.export.export(module, inputs, strict=False)
    art_torch = compile_exported_program(ep, link_libtorch=True)
    art_etm = compile_exported_program(ep, link_libtorch=False)
    runner = torch_runner(art_torch.so_path, art_torch.weights_path)
    return _Prepared(name, spec.description, module, list(inputs), want, art_etm, runner)


def bench_model(p: _Prepared, args: argparse.Namespace, tmp: Path) -> bm.Comparison:
    from etmetal.shims import AotiModel, load_bridge

    bridge = load_bridge()
    runner, args_list, want = p.runner, p.inputs, p.want
    model = AotiModel(p.etmetal_artifact.so_path, p.etmetal_artifact.weights_path.read_bytes())
    errs = {
        "torch_aoti": (runner.run(args_list)[0] - want).abs().max().item(),
        "etmetal_shims": (model.run(args_list)[0] - want).abs().max().item(),
    }
    calls0 = bridge.calls
    model.run(args_list)
    shim_calls = bridge.calls - calls0
    arms = [
        bm.Arm("torch_aoti", lambda: runner.run(args_list)),
        bm.Arm("etmetal_shims", lambda: model.run(args_list)),
    ]
    method, n_delegates = (
        (None, None) if args.no_pte else delegate_method(p.module, tuple(args_list), tmp)
    )
    stock = None
    if method is not None:
        errs["etmetal_delegate"] = (method.execute(args_list)[0] - want).abs().max().item()
        arms.append(bm.Arm("etmetal_delegate", lambda: method.execute(args_list)))
        stock = stock_method(tmp / "model.pte")
        errs["stock_delegate"] = (stock.execute(args_list)[0] - want).abs().max().item()
        arms.append(bm.Arm("stock_delegate", lambda: stock.execute(args_list)))
    bad = {k: e for k, e in errs.items() if not e <= 1e-4 * max(1.0, want.abs().max().item())}
    if bad:
        raise SystemExit(f"bench delegate: {p.name}: outputs differ from eager: {bad}")
    inner = bm.calibrate_inner(arms[1].fn, target_s=2e-3)
    timings = bm.interleaved(arms, repeat=args.repeat, warmup=3, inner=inner, budget_s=args.budget)
    row = bm.Comparison("delegate", p.name, timings)
    row.add_ratio("etmetal_shims", "torch_aoti", TARGETS.get(p.name))
    if method is not None:
        row.add_ratio("etmetal_delegate", "torch_aoti", TARGETS.get(p.name))
        row.add_ratio("stock_delegate", "torch_aoti")
    if method is not None:
        # what the .pte path adds on top of the delegate: the Method's input checks and
        # output handling, and whatever edge lowering changed in the compiled graph
        row.extra["method_overhead_us"] = (
            timings["etmetal_delegate"].median_s - timings["etmetal_shims"].median_s
        ) * 1e6
    row.extra.update(
        description=p.description,
        max_abs_err_vs_eager=errs,
        calls_per_sample=inner,
        shim_calls_per_run=shim_calls,
        delegate_path="pte" if method is not None else "shims only (no runtime delegate)",
        delegate_calls=n_delegates,
    )
    model.close()
    return row
