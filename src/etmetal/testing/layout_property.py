"""The layout property check: each generated program (``layout_programs``) lowered in the
four ``_skip_dim_order`` x ``remove_view_copy`` configurations, with the stock
``ExecutorchBackendConfig`` and with ``etmetal.backend_config()``, run on ExecuTorch's own
runtime and compared with eager.

Every cell gets one status: ``correct`` (|err| <= 1e-5 of the eager output's scale, or
within the portable kernels' own rounding, below), ``wrong``, ``runtime error``, ``refused`` (lowering raised a named layout error) or
``lowering error`` (anything else raised while lowering: a bug for etmetal). The property
holds when no etmetal cell is wrong, a runtime error or a lowering error, and programs in
the default dim order everywhere come out of etmetal's lowering with no conversion added
and every view the stock lowering makes.

The rounding rule. The stock runtime's result is computed by the portable kernels, and one
of them is less exact than eager float32: ``native_layer_norm`` takes the variance as
E[x^2] - E[x]^2 in float32, which cancels when a short row (the generator's layer norms run
over a last dim 2-8 wide) has a mean large against its spread. Eager float32 stays within
~1e-6 of float64 there; the kernel's arithmetic can be 1e-4 away whatever the layout. So a
cell of a program with a layer norm that misses 1e-5 against eager is judged once more,
against eager in float64: it is ``correct`` when its error from float64 is at most
``max(1e-5, 2 * d)``, where ``d`` is how far eager float32 *computing its layer norms the
kernel's way* (``layout_programs.one_pass_layer_norm``) is from float64 -- the rounding that
arithmetic itself makes on this program and input. The bar never loosens for programs
without a layer norm, nor past twice that measured rounding; a layout bug moves whole
elements (errors of the outputs' own scale), far above it
(``test_layout_property.py`` checks a wrong permutation is still ``wrong``).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from etmetal.testing.layout_programs import GeneratedProgram, generated_programs
from etmetal.testing.view_copy_matrix import (
    count_view_ops,
    eager_outputs,
    kernel_calls,
    lower,
    max_abs_error,
    run_on_stock_runtime,
    to_edge_for,
)

TOLERANCE = 1e-5
ROUNDING_FACTOR = 2.0  # the rounding rule's bar: this times the kernel arithmetic's own error
STATUSES = ("correct", "wrong", "runtime error", "refused", "lowering error")
LOWERINGS = ("stock", "etmetal")
CONFIGS = tuple(itertools.product((False, True), (False, True)))  # skip_dim_order, remove_vc
# kernels that copy a tensor into another dim order (or dtype); what the lowering adds
_CONVERSION_KERNELS = (
    "dim_order_ops::_to_dim_order_copy",
    "dim_order_ops::_clone_dim_order",
    "aten::clone",
    "aten::_to_copy",
)


@dataclass
class Cell:
    program: str
    skip_dim_order: bool
    remove_view_copy: bool
    lowering: str
    status: str
    detail: str = ""
    conversions: int | None = None  # conversion kernel calls the lowering added
    views: tuple[int, int] | None = None  # (view_copy kernel calls, memory.view nodes)


def scaled_error(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    """max |actual - expected| over all outputs, divided by max(1, max |expected|)."""
    scale = max([1.0] + [e.abs().max().item() for e in expected if e.numel()])
    return max_abs_error(actual, expected) / scale


def conversions_added(edge_graph: torch.fx.Graph, manager: Any) -> int:
    """Conversion kernel calls in the emitted program minus conversion operators the edge
    program already had (``.contiguous()``, ``.to(memory_format=...)`` in the model)."""
    emitted = sum(kernel_calls(manager, name) for name in _CONVERSION_KERNELS)
    names = {name.split("::")[1] for name in _CONVERSION_KERNELS}
    existing = sum(
        1
        for n in edge_graph.nodes
        if n.op == "call_function"
        and getattr(getattr(n.target, "_schema", None), "name", "").split("::")[-1] in names
    )
    return emitted - existing


@dataclass
class RoundingReference:
    """What the rounding rule compares with: eager in float64, and the bar (scaled error
    from it) that the portable kernels' arithmetic itself reaches on this program."""

    float64: list[torch.Tensor]
    bar: float


def rounding_reference(
    program: GeneratedProgram, inputs: Sequence[torch.Tensor]
) -> RoundingReference | None:
    """The rounding rule's reference, or None when it does not apply (no layer norm)."""
    if not any(step.kind == "layer_norm" for step in program.steps):
        return None
    wide = dataclasses.replace(program, dtype=torch.float64)
    with torch.no_grad():
        exact = _as_list(wide.module()(*[t.double() for t in inputs]))
        kernel_way = _as_list(program.module(portable_layer_norm=True)(*inputs))
    own_error = scaled_error(kernel_way, exact)
    return RoundingReference(exact, max(TOLERANCE, ROUNDING_FACTOR * own_error))


def judge(
    outputs: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    reference: Callable[[], RoundingReference | None],
) -> tuple[str, str]:
    """(status, detail) of one run's outputs: within 1e-5 of eager, or else within the
    rounding rule's bar (``reference`` is called only then)."""
    error = scaled_error(outputs, expected)
    if error <= TOLERANCE:
        return "correct", ""
    detail = f"scaled |err| {error:.3g}"
    rounding = reference()
    if rounding is None:
        return "wrong", detail
    wide_error = scaled_error([t.double() for t in outputs], rounding.float64)
    detail += f"; vs float64 {wide_error:.3g}, kernel-rounding bar {rounding.bar:.3g}"
    return ("correct" if wide_error <= rounding.bar else "wrong"), detail


def _as_list(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _is_named_refusal(exc: BaseException) -> bool:
    from etmetal.layout.layout_safe_view_copy_pass import LayoutSafeViewCopyError

    return isinstance(exc, LayoutSafeViewCopyError)


def check_program(program: GeneratedProgram) -> list[Cell] | str:
    """Every cell of one program, or why the program was not checked (eager or export
    failed: then there is nothing to compare with)."""
    inputs = program.run_inputs()
    try:
        expected = eager_outputs(program, inputs)
        exported = program.export()
    except Exception as exc:  # not a program eager and export run: not in the property
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    computed: list[RoundingReference | None] = []

    def reference() -> RoundingReference | None:  # computed once, when first needed
        if not computed:
            computed.append(rounding_reference(program, inputs))
        return computed[0]

    cells = []
    for skip in (False, True):
        edge = to_edge_for(exported, skip_dim_order=skip)
        edge_graph = edge.exported_program().graph
        for rvc, lowering in itertools.product((False, True), LOWERINGS):
            cell = Cell(program.name, skip, rvc, lowering, "correct")
            cells.append(cell)
            try:
                manager = lower(edge, remove_view_copy=rvc, lowering=lowering)
            except Exception as exc:
                named = lowering == "stock" or _is_named_refusal(exc)
                cell.status = "refused" if named else "lowering error"
                cell.detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                continue
            cell.conversions = conversions_added(edge_graph, manager)
            cell.views = count_view_ops(manager)
            try:
                outputs = run_on_stock_runtime(manager.buffer, inputs)
                cell.status, cell.detail = judge(outputs, expected, reference)
            except (RuntimeError, ValueError) as exc:
                cell.status, cell.detail = "runtime error", str(exc)
    return cells


def contiguous_violations(program: GeneratedProgram, cells: Sequence[Cell]) -> list[str]:
    """For a program in the default dim order everywhere: etmetal's lowering must add no
    conversion and keep every view (and view_copy) the stock lowering makes."""
    if not program.contiguous:
        return []
    found = []
    by_key = {(c.skip_dim_order, c.remove_view_copy, c.lowering): c for c in cells}
    for skip, rvc in CONFIGS:
        mine, stock = by_key[(skip, rvc, "etmetal")], by_key[(skip, rvc, "stock")]
        where = f"{program.name} skip_dim_order={skip} remove_view_copy={rvc}"
        if mine.conversions:
            found.append(f"{where}: {mine.conversions} conversions added")
        if stock.views is not None and mine.views != stock.views:
            found.append(f"{where}: (view_copy, memory.view) {mine.views}, stock {stock.views}")
    return found


@dataclass
class PropertyRun:
    cells: list[Cell]
    skipped: dict[str, str]  # program name -> why it was not checked
    contiguous_problems: list[str]
    descriptions: dict[str, str]

    def counts(self, lowering: str) -> Counter:
        return Counter(c.status for c in self.cells if c.lowering == lowering)

    def failures(self) -> list[Cell]:
        return [c for c in self.cells if c.lowering == "etmetal" and c.status not in
                ("correct", "refused")]  # fmt: skip

    @property
    def ok(self) -> bool:
        return not self.failures() and not self.contiguous_problems


def run_property(
    count: int,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    programs: Sequence[GeneratedProgram] | None = None,
) -> PropertyRun:
    """The first ``count`` programs of sequence ``seed``, or exactly ``programs``."""
    run = PropertyRun([], {}, [], {})
    chosen = list(programs) if programs is not None else generated_programs(count, seed)
    count = len(chosen)
    for index, program in enumerate(chosen):
        run.descriptions[program.name] = program.description
        result = check_program(program)
        if isinstance(result, str):
            run.skipped[program.name] = result
        else:
            run.cells.extend(result)
            run.contiguous_problems.extend(contiguous_violations(program, result))
        if progress is not None:
            statuses = "" if isinstance(result, str) else " ".join(
                f"{c.lowering[0]}:{c.status}" for c in result
            )  # fmt: skip
            progress(f"[{index + 1}/{count}] {program.name} {statuses or result}")
    return run


def format_property_table(run: PropertyRun) -> str:
    """Counts per lowering, conversions added by etmetal, and every etmetal failure."""
    header = ("lowering", *STATUSES, "cells")
    rows = [header]
    for lowering in LOWERINGS:
        counts = run.counts(lowering)
        total = sum(counts.values())
        rows.append((lowering, *(str(counts.get(s, 0)) for s in STATUSES), str(total)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    programs = len({c.program for c in run.cells})
    lines.append(
        f"{programs} programs x {len(CONFIGS)} configs checked; "
        f"{len(run.skipped)} skipped (eager or export failed)"
    )
    per_program: dict[str, int] = {}
    for c in run.cells:
        if c.lowering == "etmetal" and c.conversions is not None:
            per_program[c.program] = max(per_program.get(c.program, 0), c.conversions)
    per_cell = [c.conversions for c in run.cells if c.lowering == "etmetal" and
                c.conversions is not None]  # fmt: skip
    if per_cell:
        lines.append(
            "etmetal conversions added per program (most over its configs): "
            f"median {statistics.median(per_program.values()):g}, "
            f"max {max(per_program.values())}; per lowered cell: median "
            f"{statistics.median(per_cell):g}, max {max(per_cell)}"
        )
    lines.append(
        f"contiguous programs changed by etmetal: {len(run.contiguous_problems)}"
        + "".join(f"\n  {p}" for p in run.contiguous_problems)
    )
    for c in run.failures():
        lines.append(
            f"FAIL {c.program} skip_dim_order={c.skip_dim_order} "
            f"remove_view_copy={c.remove_view_copy}: {c.status}: {c.detail}\n"
            f"  {run.descriptions.get(c.program, '')}"
        )
    refusals = [c for c in run.cells if c.lowering == "etmetal" and c.status == "refused"]
    for c in refusals:
        lines.append(f"refused {c.program}: {c.detail}")
    return "\n".join(lines)
