"""Running a loaded AOTI model: inputs lent as shim tensors, outputs taken back as torch
tensors, the general path and the steady one (``steady_run``) after the first run.

``ModelRunner`` is a collaborator of ``model.AotiModel``: the model loads the ``.so`` and
creates the container, then hands the runner what a run needs (the container, its run
function, the bridge's call counter, the proxy executor handle, the model's error check)
and delegates ``run``/``run_into`` to it. The runner owns the run state: the input cache,
the steady run and the argument arrays.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Sequence

import torch

from etmetal.shims.abi_codes import DEVICE_CPU

from .bridge import BridgeError
from .context import ShimContext
from .steady_run import SteadyResult, SteadyRun
from .storage import ShimError, Storage, Tensor, tensor_from_torch


class AotiModelError(RuntimeError):
    """Loading or running a compiled model failed; the message names the step and the cause."""


def nested_run_error(name: str, running: object) -> AotiModelError:
    """Runs of one context do not nest: a run started from inside another (a shim callback
    running a model of the same context) would reuse the state of the one in progress."""
    return AotiModelError(
        f"{name}: run started inside the run of "
        f"{getattr(running, 'so_path', running)} in the same ShimContext"
    )


def check_step(lib: ctypes.CDLL, ctx: ShimContext, name: str, rc: int, step: str) -> None:
    """Raise the model's error for ``step`` when ``rc`` says it failed: the container's own
    message (``AOTInductorGetLastError`` of ``lib``) and the context's last shim error."""
    if rc == 0:
        return
    msg = ctypes.c_char_p()
    lib.AOTInductorGetLastError(ctypes.byref(msg))
    model_msg = (msg.value or b"").decode(errors="replace").strip()
    shim_msg = ctx.error
    raise AotiModelError(
        f"{name}: {step} failed: {model_msg or 'error code ' + str(rc)}"
        + (f" (last shim error: {shim_msg})" if shim_msg else "")
    )


def raise_unchecked(ctx: ShimContext, name: str, step: str) -> None:
    """Fail ``step`` if a shim whose return code the ``.so`` ignores failed during it (the
    Metal wrapper never checks its ``aoti_torch_mps_*`` kernel calls)."""
    message = ctx.take_unchecked_error()
    if message:
        raise AotiModelError(
            f"{name}: {step} failed: a shim call the .so does not check failed: {message}"
        )


class ModelRunner:
    """``run`` / ``run_into`` of one ``AotiModel`` container and the steps they take."""

    def __init__(
        self,
        model: object,
        *,
        container: ctypes.c_void_p,
        run_fn: Callable,
        lib: ctypes.CDLL,
        counter: ctypes.c_uint64,
        proxy: int | None,
        device_type: int,
        num_inputs: int,
        num_outputs: int,
        steady: SteadyRun | None,
    ) -> None:
        """``model``: the owner, recorded as the context's ``running`` model during a run
        (the shims read its policy); ``lib``: the loaded model (its last error);
        ``counter``: the bridge's count of calls that reached etmetal."""
        # weakly: the model owns the runner, and a dropped model must still close at once
        # (no reference cycle for the collector to find later)
        self._owner = weakref.ref(model)
        self.context: ShimContext = model.context
        self.name = model.so_path.name
        self._container, self._run_fn, self._counter = container, run_fn, counter
        self._lib, self._proxy, self._device_type = lib, proxy, device_type
        self.num_inputs, self.num_outputs = num_inputs, num_outputs
        self._in_arr = (ctypes.c_void_p * max(num_inputs, 1))()
        self._out_arr = (ctypes.c_void_p * max(num_outputs, 1))()
        self._input_cache: dict[tuple, Tensor] = {}
        self._steady = steady
        # the steady run, once the first run is done (it learns the outputs' geometry)
        self._ready: SteadyRun | None = None

    def _describe_input(self, i: int, t: torch.Tensor) -> Tensor:
        """The shim tensor borrowing input ``t``, reused while ``t``'s memory and geometry are.

        The borrowed storage holds no reference to the caller's memory between runs
        (its ATen views are built lazily and dropped when the run's handles go), so the
        cache keeps nothing alive; its key pins the address, extent, shape and dtype.
        """
        untyped = t.untyped_storage()
        key = (t.data_ptr(), t.shape, t.stride(), t.dtype, untyped.data_ptr(), untyped.nbytes())
        desc = self._input_cache.get(key)
        if desc is None:
            if not t.is_cpu:
                raise AotiModelError(f"input {i}: expected a cpu torch.Tensor, got {t!r:.80}")
            storage = Storage(
                untyped.data_ptr(), untyped.nbytes(), owned=False, device_type=self._device_type
            )
            try:
                desc = tensor_from_torch(t, storage)
            except ShimError as exc:
                raise AotiModelError(f"input {i}: {exc}") from exc
            if len(self._input_cache) >= 4 * max(self.num_inputs, 1):
                self._input_cache.clear()  # inputs keep changing: do not grow without bound
            self._input_cache[key] = desc
        return desc

    def _input_handles(self, inputs: Sequence[torch.Tensor]) -> list[int]:
        if len(inputs) != self.num_inputs:
            raise AotiModelError(
                f"{self.name}: expected {self.num_inputs} inputs, got {len(inputs)}"
            )
        handles, ctx = [], self.context
        try:
            for i, t in enumerate(inputs):
                if not isinstance(t, torch.Tensor):
                    raise AotiModelError(f"input {i}: expected a cpu torch.Tensor, got {t!r:.80}")
                handles.append(ctx.register(self._describe_input(i, t)))
        except BaseException:
            for h in handles:
                ctx.unregister(h)
            raise
        return handles

    def _take_output(self, handle: int, i: int) -> torch.Tensor:
        """The output as a torch tensor: adopted when it owns its storage alone, else copied.

        A native output (made by the bridge) teaches the steady run its geometry."""
        ctx = self.context
        native = ctx.native
        predictable = native is not None and native.read(handle) is not None
        t = ctx.lookup(handle, "output")
        view = t.torch()
        storage = t.storage
        alone = storage.owned and storage.count == 1
        if alone and native is not None and ctx.native_storages.get(storage.ptr) is storage:
            alone = native.native_refs(storage.ptr) == 0  # no native view of it is left either
        if alone:
            t.storage.hand_over()  # the caller's tensor keeps the memory; never recycle it
            result = view
        else:
            result = view.clone()
        ctx.unregister(handle)
        if self._steady is not None:
            self._steady.learn_output(i, result if predictable else None)
        return result

    def run(
        self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Run once. Inputs are borrowed (no copy) for the duration of the call.

        Without ``outputs``, returns new tensors (adopting the model's buffers where it
        can). With ``outputs``, copies each result into the caller's tensor (resizing it
        when the shape differs, for dynamic shapes) and returns them.
        """
        if outputs is None:
            return self.run_into(inputs)
        results = self.run_into(inputs, outputs)
        for i, (dst, src) in enumerate(zip(outputs, results)):
            if src is None:  # already written into dst
                continue
            if dst.dtype != src.dtype:
                raise AotiModelError(f"output {i}: dtype {src.dtype}, caller's tensor {dst.dtype}")
            if dst.shape != src.shape:
                dst.resize_(src.shape)
            dst.copy_(src)
        return list(outputs)

    def run_into(
        self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor | None]:
        """Run once; results that came back with exactly the geometry of ``outputs[i]`` are
        written there directly (None in the returned list), the others are returned as
        new tensors for the caller to place (dynamic shapes, layouts that changed)."""
        if outputs is not None and len(outputs) != self.num_outputs:
            raise AotiModelError(
                f"{self.name}: expected {self.num_outputs} outputs, got {len(outputs)}"
            )
        ctx = self.context
        with ctx.run_lock:
            if ctx.running is not None:
                raise nested_run_error(self.name, ctx.running)
            ctx.running = self._owner()  # the run's record: shims read the model's policy
            try:
                ready = self._ready
                if ready is not None:
                    # a device's launches report their failures afterwards (the Metal
                    # wrapper ignores their return codes); the host has none to check
                    device = self._device_type != DEVICE_CPU
                    if device:
                        ctx.take_unchecked_error()
                    ran = ready.run(inputs, outputs)
                    if ran is not None and ran.rc == 0 and not ran.pending:
                        if device:
                            raise_unchecked(ctx, self.name, "run")
                        return ran.results  # the usual case: everything went through etm_run
                    results = self._run_locked(inputs, outputs, ran)
                    if device:
                        raise_unchecked(ctx, self.name, "run")
                    return results
                ctx.take_unchecked_error()
                results = self._run_locked(inputs, outputs, None)
                raise_unchecked(ctx, self.name, "run")
                return results
            finally:
                ctx.running = None

    @property
    def steady(self) -> SteadyRun | None:
        """The prepared steady run (None: this model always runs the general way)."""
        return self._steady

    def finish_fast(self, inputs: Sequence[torch.Tensor], rc: int, results: list) -> list:
        """Complete a run a ``FastRun`` started that came back unusual (an error code, an
        output or input Python must take): the steady run's own completion, under the
        locks and the ``running`` record the fast run holds. On a device, a launch failure
        recorded during the run fails it as ``run_into`` fails it (after the container's
        own error, which ``_run_locked`` raises first)."""
        finished = self._run_locked(inputs, None, self._steady.complete(rc, results))
        if self._device_type != DEVICE_CPU:
            raise_unchecked(self.context, self.name, "run")
        return finished

    def _run_locked(self, inputs, outputs, ran: SteadyResult | None) -> list[torch.Tensor | None]:
        """Finish a steady run (``ran``) that needs Python, or run the general way."""
        if ran is None and self._ready is not None:
            ran = self._ready.run(inputs, outputs)
        if ran is None:
            return self._run_general(inputs)
        results = ran.results
        if ran.rc != 0:
            ctx = self.context
            for h in results:
                if type(h) is int and ctx.is_live(h):
                    ctx.unregister(h)
            check_step(self._lib, self.context, self.name, ran.rc, "run")
        if ran.pending:
            for i, h in enumerate(results):
                if type(h) is int:
                    results[i] = self._take_output(h, i)
        return results

    def _run_general(self, inputs) -> list[torch.Tensor]:
        """Every run's path until the outputs are known, and whenever the steady one cannot."""
        ctx = self.context
        handles = self._input_handles(inputs)
        in_arr, out_arr = self._in_arr, self._out_arr  # reused: one run at a time (run lock)
        for i, h in enumerate(handles):
            in_arr[i] = h
        for i in range(self.num_outputs):
            out_arr[i] = None
        calls = self._counter
        before = calls.value
        rc = self._run_fn(
            self._container, in_arr, len(handles), out_arr, self.num_outputs, None, self._proxy
        )
        self._ready = self._steady  # from now on the steady run serves
        if self._steady is not None:
            self._steady.armed.value = 1  # and the fast run (fast_run.py) over it
        produced = out_arr[: self.num_outputs]
        # inputs are stolen by the container; release any it left behind (e.g. on failure)
        for h in handles:
            if h not in produced and ctx.is_live(h):
                ctx.unregister(h)
        if rc != 0:
            for h in produced:
                if ctx.is_live(h):
                    ctx.unregister(h)
            check_step(self._lib, self.context, self.name, rc, "run")
        if calls.value == before:
            raise BridgeError(
                f"{self.name}: a run made no shim call that reached etmetal; the .so is "
                "bound to another aoti_torch implementation (or to another ShimContext's bridge)"
            )
        results = []
        for i, h in enumerate(produced):
            if not ctx.is_live(h):
                raise AotiModelError(f"{self.name}: output {i} is not a live shim tensor")
            results.append(self._take_output(h, i))
        return results
