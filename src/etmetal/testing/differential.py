"""The differential check: one workload on the native shims and on the Python reference.

``differential(work)`` runs ``work(implementation)`` twice, once with every shim of the
context served by the native implementation and once by the Python one (the reference,
``ShimContext.set_implementation("python")``), while ``shim_trace`` records every shim call
the ``.so`` files make and what each returned. The two arms must agree:

- every output, bit for bit (dtype, shape, strides of the values, bytes);
- the sequence of shim calls, name and returned error code, call for call, under the
  mapping below;
- the Python arm really ran on the Python shims: every shim it called was served in Python,
  except the ones the bridge always serves in C (:data:`ALWAYS_NATIVE`).

Both arms must run fresh mappings of the ``.so`` files: a ``.so`` memoizes some calls in
function-local statics (the type codes, ``aoti_torch_dtype_*`` and the like; an
``mps_emulated`` wrapper's shader libraries and kernel functions), made once per mapping,
so an arm reusing the other's mapping would skip them (and use the other implementation's
library handles). ``pte_workload`` gets that from the runtime, which writes each delegate's
``.so`` to a private directory per load; ``aoti_workload`` copies the ``.so`` per arm.

With that, nothing is mapped between the two sequences: every call of the ``.so`` is
compared by position, name and result. The one difference the implementations may show is
where a call was served, which the per-shim counts check (:func:`check_reference_ran_in_python`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from etmetal.shims import default_context
from etmetal.testing.shim_counts import context_counts, delta

from .shim_trace import Call, tracing

# what a workload returns: the outputs of each of its runs, in order
Outputs = Sequence[Sequence[torch.Tensor]]
# shims the bridge serves in C on both implementations (AOTI toggles grad mode around each
# run: a thread flag kept in C, not a tensor operation)
ALWAYS_NATIVE = frozenset({"aoti_torch_grad_mode_is_enabled", "aoti_torch_grad_mode_set_enabled"})


class DifferentialMismatch(AssertionError):
    """The two implementations disagreed; the message says where."""


@dataclass
class Arm:
    """What one implementation did: outputs per run, shim calls, per-shim counts."""

    implementation: str
    outputs: list[list[torch.Tensor]]
    calls: list[Call]
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Report:
    native: Arm
    python: Arm

    @property
    def calls(self) -> int:
        return len(self.native.calls)


def _copied(outputs: Outputs) -> list[list[torch.Tensor]]:
    # outputs may be views of memory the next run overwrites (a model's own buffers)
    return [[t.detach().clone() for t in run] for run in outputs]


def run_arm(work: Callable[[str], Outputs], implementation: str, context=None) -> Arm:
    """``work(implementation)`` with the context's shims on ``implementation``, traced."""
    ctx = context or default_context()
    with tracing(ctx) as rec:
        previous = ctx.set_implementation(implementation)
        before = context_counts(ctx)
        rec.start()
        try:
            outputs = _copied(work(implementation))
        finally:
            calls = rec.stop()
            ctx.set_implementation(previous)
        counts = delta(context_counts(ctx), before)
    return Arm(implementation, outputs, calls, counts)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.device != b.device:
        return f"device {a.device} vs {b.device}"
    x, y = _bytes_view(a.detach().cpu().contiguous()), _bytes_view(b.detach().cpu().contiguous())
    if not torch.equal(x, y):
        return f"{int((x != y).sum())} of {x.numel()} bytes differ"
    return None


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


def compare_outputs(native: Arm, python: Arm) -> None:
    if len(native.outputs) != len(python.outputs):
        raise DifferentialMismatch(
            f"{len(native.outputs)} runs natively, {len(python.outputs)} on the Python shims"
        )
    for r, (a_run, b_run) in enumerate(zip(native.outputs, python.outputs)):
        if len(a_run) != len(b_run):
            raise DifferentialMismatch(f"run {r}: {len(a_run)} outputs vs {len(b_run)}")
        for i, (a, b) in enumerate(zip(a_run, b_run)):
            why = _same_tensor(a, b)
            if why:
                raise DifferentialMismatch(f"run {r}, output {i}: native vs Python: {why}")


def _window(calls: list[Call], at: int) -> str:
    lo = max(0, at - 3)
    return "; ".join(f"[{i}] {c}" for i, c in enumerate(calls[lo : at + 3], lo))


def compare_calls(native: Arm, python: Arm) -> None:
    a, b = native.calls, python.calls
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            raise DifferentialMismatch(
                f"shim call {i} differs: native {x} / Python {y}\n"
                f"  native: {_window(a, i)}\n  Python: {_window(b, i)}"
            )
    if len(a) != len(b):
        i = min(len(a), len(b))
        raise DifferentialMismatch(
            f"native made {len(a)} shim calls, Python {len(b)}; the first extra: "
            f"{(a if len(a) > len(b) else b)[i]}"
        )


def _served_in_c_on_both(name: str) -> bool:
    # the getters read the handle's record, which the Python implementation keeps too
    return name in ALWAYS_NATIVE or name.startswith("aoti_torch_get_")


def check_reference_ran_in_python(python: Arm, lent: int = 0) -> None:
    """Every shim of the Python arm was served in Python, but for the getters, the grad
    mode and at most ``lent`` deletes: the steady run lends a run's inputs as native
    borrowed records on both implementations, and their delete is the record's own."""
    native = {n: c for n, c in python.counts.items() if c[0] and not _served_in_c_on_both(n)}
    deletes = native.pop("aoti_torch_delete_tensor_object", (0, 0))[0]
    if native or deletes > lent:
        raise DifferentialMismatch(
            f"the Python arm had shims served in C: {native}, {deletes} deletes (at most "
            f"{lent} of lent inputs): the reference did not run"
        )


def differential(work: Callable[[str], Outputs], context=None, *, lent: int = 0) -> Report:
    """Run ``work`` on the native and on the Python implementation and check that they
    agree (module docstring); the report holds both arms. ``work(implementation)`` runs
    the models and returns each run's outputs; it may pass ``shims=implementation`` to an
    ``AotiModel`` it opens (the context's choice applies either way). ``lent``: how many
    input tensors the workload's runs lend in all (the bound on deletes the Python arm may
    serve in C, :func:`check_reference_ran_in_python`)."""
    native = run_arm(work, "native", context)
    python = run_arm(work, "python", context)
    if not native.calls:
        raise DifferentialMismatch(
            "no shim call was recorded: the workload opened no model inside the trace"
        )
    compare_outputs(native, python)
    compare_calls(native, python)
    check_reference_ran_in_python(python, lent)
    return Report(native, python)


# --- workloads: what the differential test runs ---------------------------------------------

# one step of a workload: (method name, its inputs, or a function of the outputs so far)
Step = tuple[str, "Sequence[torch.Tensor] | Callable[[list[list[torch.Tensor]]], Sequence]"]


def _inputs_of(step_inputs, done: list[list[torch.Tensor]]) -> list:
    return list(step_inputs(done) if callable(step_inputs) else step_inputs)


def pte_workload(pte: bytes, steps: Sequence[Step]) -> Callable[[str], Outputs]:
    """A workload executing a ``.pte``'s methods in etmetal's runtime, ``steps`` in order
    (each method loaded once, destroyed at the end)."""

    def work(implementation: str) -> Outputs:
        from etmetal.runtime import Runtime

        program = Runtime.get().load_program(pte, trust_native_code=True)
        methods = {name: program.load_method(name) for name in dict.fromkeys(n for n, _ in steps)}
        done: list[list[torch.Tensor]] = []
        try:
            for name, step_inputs in steps:
                outs = methods[name].execute(_inputs_of(step_inputs, done))
                done.append([t.detach().clone() for t in outs])
        finally:
            for method in methods.values():
                method.destroy()
        return done

    return work


def aoti_workload(
    artifact, runs: Sequence[Sequence[torch.Tensor]], *, device: str = "cpu"
) -> Callable[[str], Outputs]:
    """A workload opening ``artifact`` (an ``AotiArtifact``) as one ``AotiModel`` on the
    arm's implementation and running it once per entry of ``runs``."""

    def work(implementation: str) -> Outputs:
        from etmetal.shims import AotiModel

        done = []
        # a fresh mapping of the .so per arm (module docstring)
        directory = Path(tempfile.mkdtemp(prefix="etmetal-differential-"))
        try:
            so_path = directory / artifact.so_path.name
            shutil.copyfile(artifact.so_path, so_path)
            with AotiModel(
                so_path,
                artifact.weights_bytes(),
                device=device,
                extern_nodes=artifact.extern_nodes_bytes(),
                shims=implementation,
            ) as model:
                for inputs in runs:
                    done.append([t.detach().clone() for t in model.run(list(inputs))])
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return done

    return work
