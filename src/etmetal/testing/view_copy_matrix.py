"""The ``view_copy`` layout matrix on the stock runtime (``etmetal regress view-copy``, the demo).

Every case of :mod:`etmetal.examples.view_copy` is lowered in the four ``_skip_dim_order`` x
``remove_view_copy`` combinations, once with the stock ``ExecutorchBackendConfig`` and once
with ``etmetal.backend_config()``, run with ExecuTorch's own runtime
(``executorch.runtime``) and compared against eager PyTorch. A stock failure is a table
row (error code and failing operator), not a crash. The command fails if any etmetal
row is not exact.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from etmetal.examples.view_copy import CASES, ViewCopyCase

LOWERINGS = ("stock", "etmetal")
CONFIGS = tuple(itertools.product((False, True), (False, True)))  # skip_dim_order, remove_vc
TOLERANCE = 1e-5
CL = torch.channels_last


@dataclass
class MatrixRow:
    model: str
    skip_dim_order: bool
    remove_view_copy: bool
    lowering: str
    max_abs_error: float | None  # None when lowering or running failed
    error: str | None  # what failed, e.g. "0x12 in aten::view_copy.out"
    view_copy_ops: int  # view_copy kernel calls left in the emitted program
    views: int  # memory.view nodes (storage shared with the base)

    @property
    def exact(self) -> bool:
        return (
            self.error is None
            and self.max_abs_error is not None
            and (self.max_abs_error <= TOLERANCE)
        )

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        return "exact" if self.exact else "WRONG"


def to_edge_for(
    case_or_program: ViewCopyCase | torch.export.ExportedProgram, *, skip_dim_order: bool
):
    """``to_edge`` with ``EdgeCompileConfig(_skip_dim_order=...)``."""
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = case_or_program.export() if isinstance(case_or_program, ViewCopyCase) else case_or_program
    return to_edge(ep, compile_config=EdgeCompileConfig(_skip_dim_order=skip_dim_order))


def lower(edge, *, remove_view_copy: bool, lowering: str):
    """``to_executorch`` on a copy of ``edge`` (it rewrites the edge program in place, and
    copying is much cheaper than running ``to_edge`` again) with the stock
    ``ExecutorchBackendConfig`` or ``etmetal.backend_config()``."""
    from executorch.exir import ExecutorchBackendConfig

    if lowering == "stock":
        config = ExecutorchBackendConfig(remove_view_copy=remove_view_copy)
    elif lowering == "etmetal":
        from etmetal.layout.config import backend_config

        config = backend_config(remove_view_copy=remove_view_copy)
    else:
        raise ValueError(f"unknown lowering {lowering!r}; choose from {', '.join(LOWERINGS)}")
    return copy.deepcopy(edge).to_executorch(config)


def lower_case(case: ViewCopyCase) -> dict[tuple[bool, bool, str], Any]:
    """Every cell of one case: (skip_dim_order, remove_view_copy, lowering) -> the
    ``ExecutorchProgramManager``, or the exception lowering raised."""
    cells: dict[tuple[bool, bool, str], Any] = {}
    ep = case.export()
    for skip in (False, True):
        try:
            edge = to_edge_for(ep, skip_dim_order=skip)
        except Exception as exc:  # every cell of this edge program failed the same way
            cells.update({(skip, rvc, low): exc for rvc in (False, True) for low in LOWERINGS})
            continue
        for rvc, low in itertools.product((False, True), LOWERINGS):
            try:
                cells[(skip, rvc, low)] = lower(edge, remove_view_copy=rvc, lowering=low)
            except Exception as exc:  # a lowering failure is a result, shown in the table
                cells[(skip, rvc, low)] = exc
    return cells


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collect the runtime's log (ET_LOG): the pybindings write it through Python's
    ``sys.stderr``, native code may write to file descriptor 2; catch both."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    text = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stderr(text):
                yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())
            lines.extend(text.getvalue().splitlines())


_KERNEL_FAILURE = re.compile(r"in operator (\S+?):? (0x[0-9a-fA-F]+)")
_ERROR_CODE = re.compile(r"error (0x[0-9a-fA-F]+)")


def as_stock_runtime_input(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as ``executorch.runtime`` must be handed it.

    The pybindings read an input's data pointer in the dim order the program declares and
    only take contiguous or (4-D) channels-last tensors. A dense tensor in another dim
    order (``channels_last_3d``) is therefore passed as the same bytes under contiguous
    strides: exactly the memory the program expects.
    """
    if tensor.is_contiguous() or (tensor.dim() == 4 and tensor.is_contiguous(memory_format=CL)):
        return tensor
    dim_order = tensor.dim_order()
    if not tensor.permute(*dim_order).is_contiguous():
        raise ValueError(f"input of shape {tuple(tensor.shape)} is not dense in any dim order")
    return tensor.permute(*dim_order).reshape(-1).view(tensor.shape)


def run_on_stock_runtime(
    buffer: bytes, inputs: Sequence[torch.Tensor], method: str = "forward"
) -> list[torch.Tensor]:
    """Run a program with ``executorch.runtime``. On failure raises ``RuntimeError`` whose
    message has the error code and, when the runtime logged it, the failing operator."""
    from executorch.runtime import Runtime

    runtime_inputs = [as_stock_runtime_input(t) for t in inputs]
    with _captured_stderr() as log:
        try:
            program = Runtime.get().load_program(buffer)
            outputs = program.load_method(method).execute(runtime_inputs)
            failure = None
        except RuntimeError as exc:
            failure = exc
    if failure is None:
        return list(outputs)
    text = "\n".join(log)
    kernel = _KERNEL_FAILURE.search(text)
    if kernel:
        raise RuntimeError(f"{kernel.group(2)} in {kernel.group(1)}") from failure
    code = _ERROR_CODE.search(str(failure))
    raise RuntimeError(code.group(1) if code else str(failure)) from failure


def max_abs_error(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    if len(actual) != len(expected):
        raise ValueError(f"{len(actual)} outputs, eager has {len(expected)}")
    worst = 0.0
    for index, (a, e) in enumerate(zip(actual, expected)):
        if tuple(a.shape) != tuple(e.shape):
            raise ValueError(f"output {index} has shape {tuple(a.shape)}, eager {tuple(e.shape)}")
        worst = max(worst, (a.float() - e.float()).abs().max().item() if a.numel() else 0.0)
    return worst


def kernel_calls(program_manager, operator_name: str, method: str = "forward") -> int:
    """How many instructions of the emitted method call ``operator_name`` (e.g.
    ``aten::view_copy``, ``executorch_prim::et_view``)."""
    program = program_manager.executorch_program
    plan = next(p for p in program.execution_plan if p.name == method)
    indices = {i for i, op in enumerate(plan.operators) if op.name == operator_name}
    return sum(
        1
        for chain in plan.chains
        for instruction in chain.instructions
        if getattr(instruction.instr_args, "op_index", None) in indices
    )


def count_view_ops(program_manager) -> tuple[int, int]:
    """(view_copy kernel calls in the emitted program, memory.view nodes in its graph:
    views whose storage is the base's)."""
    from executorch.exir import memory

    view_copies = kernel_calls(program_manager, "aten::view_copy")
    graph = program_manager.exported_program().graph
    views = sum(1 for n in graph.nodes if n.op == "call_function" and n.target == memory.view)
    return view_copies, views


def eager_outputs(case: ViewCopyCase, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = case.module()(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def evaluate(case: ViewCopyCase, cells: dict[tuple[bool, bool, str], Any]) -> list[MatrixRow]:
    """Run every lowered cell on the stock runtime and compare with eager."""
    inputs = case.run_inputs()
    expected = eager_outputs(case, inputs)
    rows = []
    for skip, rvc in CONFIGS:
        for lowering in LOWERINGS:
            row = MatrixRow(case.name, skip, rvc, lowering, None, None, 0, 0)
            rows.append(row)
            manager = cells[(skip, rvc, lowering)]
            if isinstance(manager, Exception):
                first_line = (str(manager).splitlines() or [""])[0][:80]
                row.error = f"lowering: {type(manager).__name__}: {first_line}"
                continue
            try:
                row.view_copy_ops, row.views = count_view_ops(manager)
                outputs = run_on_stock_runtime(manager.buffer, inputs)
                row.max_abs_error = max_abs_error(outputs, expected)
            except (RuntimeError, ValueError) as exc:
                row.error = str(exc)
    return rows


def run_matrix(cases: Sequence[ViewCopyCase] = CASES) -> list[MatrixRow]:
    return [row for case in cases for row in evaluate(case, lower_case(case))]


def format_table(rows: Sequence[MatrixRow]) -> str:
    """Plain-text table: one line per model x config x lowering."""
    header = ("model", "skip_dim_order", "remove_view_copy", "lowering", "max|err|", "result")
    lines = [header]
    for r in rows:
        err = "-" if r.max_abs_error is None else f"{r.max_abs_error:.3g}"
        result = r.error if r.error is not None else r.status
        if r.error is None:
            result += f" (view_copy kernels: {r.view_copy_ops}, memory.view: {r.views})"
        lines.append(
            (r.model, str(r.skip_dim_order), str(r.remove_view_copy), r.lowering, err, result)
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = []
    for i, line in enumerate(lines):
        cells = [cell.ljust(w) for cell, w in zip(line, widths)]
        out.append("  ".join([*cells, line[-1]]).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in [*widths, len(header[-1])]))
    return "\n".join(out)


def summary(rows: Sequence[MatrixRow]) -> str:
    bad = [r for r in rows if r.lowering == "etmetal" and not r.exact]
    stock_bad = [r for r in rows if r.lowering == "stock" and not r.exact]
    n_etmetal = sum(r.lowering == "etmetal" for r in rows)
    return (
        f"etmetal: {n_etmetal - len(bad)}/{n_etmetal} exact (|err| <= {TOLERANCE:g}); "
        f"stock: {len(stock_bad)}/{len(rows) - n_etmetal} wrong or failing"
    )
