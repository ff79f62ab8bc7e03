"""``AotiModel``: load a ``link_libtorch=False`` AOTI ``.so`` through the bridge and run it."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from etmetal.common.targets import CPU_DEVICE, HOST, METAL_DEVICE
from etmetal.shims.abi_codes import DEVICE_CPU, DEVICE_MPS
from etmetal.shims.model_link import NativeBuildError, link_wrapper

from . import fast_run, model_constants
from .bridge import Bridge
from .context import ShimContext, check_materialize
from .model_run import (
    AotiModelError,
    ModelRunner,
    check_step,
    nested_run_error,
    raise_unchecked,
)
from .model_symbols import check_needed_shims, model_link_group
from .native_fallbacks import check_implementation
from .proxy_executor import ExternNodeError, ProxyExecutor
from .proxy_native import NativeProxyExecutor, serves_device
from .standard_context import default_context
from .steady_run import SteadyRun

# devices a model container can be created for (the device string AOTI parses)
DEVICES = {CPU_DEVICE: DEVICE_CPU, METAL_DEVICE: DEVICE_MPS}


class AotiModel:
    """One AOTI model container over a ``.so`` whose ``aoti_torch_*`` calls go to etmetal.

    ``weights_blob`` is the constants blob AOTI wrote next to the ``.so``; constants
    become tensors borrowing it, so it is kept alive until ``close()``. ``materialize``
    picks the ``_reinterpret_tensor`` behaviour for this model's calls ("view", the
    default, or "upstream_copy", upstream's always-copy behaviour, for comparison only).
    ``device`` is the container device of the target the ``.so`` was compiled for (its
    record's ``container_device``): ``cpu`` for ``host``, or ``mps`` for ``mps_emulated``
    (inputs are lent as ``mps`` tensors and the ``.so`` runs its Metal kernels on the
    emulated device).
    The ``.so``'s own check of every input's dtype, sizes, strides and device is
    compiled in by etmetal's compile (``etmetal.backend.input_checks``): a mismatched
    input is an error, not an out-of-bounds read. Nothing here sets
    ``AOTI_RUNTIME_CHECK_INPUTS``; a ``.so`` built elsewhere reads it as built.
    ``context``: the ``ShimContext`` whose shims serve this model (default: the default
    context); the policy is the model's own: while the model's container runs, the
    context records the model as ``running`` and the shims read the policy from it.
    ``extern_nodes``: the extern-node table (JSON) AOTI wrote next to the ``.so``; a
    ``.so`` that calls ``aoti_torch_proxy_executor_call_function`` (operators without a
    C shim) needs it, and its runs then pass a proxy executor handle
    (``shims.proxy_executor``).
    ``constants`` (instead of ``weights_blob``): AOTI constant name -> cpu tensor, lent to
    the container as user-managed constants (no copy; see :mod:`.user_constants`), so
    several models can read one copy; the tensors must outlive the model.
    ``shims``: "native" (the default) serves the hot shims, the common CPU fallbacks and
    the constants in C (:mod:`.native_fallbacks`); "python" runs every shim of the context
    through the Python implementation, the reference, while this model is open.
    ``stats()`` says how many calls of each shim went where.
    """

    def __init__(
        self,
        so_path: str | os.PathLike,
        weights_blob: bytes | bytearray | memoryview | None = None,
        *,
        materialize: str = "view",
        context: ShimContext | None = None,
        device: str = HOST.container_device,
        extern_nodes: str | bytes | bytearray | memoryview | None = None,
        constants: Mapping[str, torch.Tensor] | None = None,
        shims: str = "native",
    ) -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {sorted(DEVICES)}, got {device!r}")
        self.device = device
        self._device_type = DEVICES[device]
        self.so_path = Path(so_path)
        self.materialize = check_materialize(materialize)
        # which implementation serves the shims while this model is open: "native" (C
        # where it can: native_fallbacks) or "python", the reference (every shim in Python)
        self.shims = check_implementation(shims)
        self.context = ctx = context or default_context()
        self._container = None
        self._runner: ModelRunner | None = None  # made with the container (``model_run``)
        self._fast_call = None  # a FastRun serving run() once the steady run is armed
        self._lib = None
        self._proxy: int | None = None
        self._native_proxy: NativeProxyExecutor | None = None
        self.constants = dict(constants) if constants is not None else None
        self._constant_handles: list[int] = []
        self._bridge: Bridge = ctx.load_bridge()
        if not self.so_path.is_file():
            raise AotiModelError(f"{self.so_path}: no such file")
        check_needed_shims(self.so_path, self._bridge, extern_nodes is not None)
        # the table is parsed (and checked against the proxy executor's allow-list) before
        # the .so is mapped: a refused table never runs the .so's constructors
        executor = None
        if extern_nodes is not None:
            try:
                text = extern_nodes if isinstance(extern_nodes, str) else bytes(extern_nodes)
                executor = ProxyExecutor.from_json(text, self._device_type)
            except ExternNodeError as exc:
                raise AotiModelError(f"{self.so_path.name}: {exc}") from exc
        self.proxy_executor: ProxyExecutor | None = executor
        try:
            # the wrapper groups bridge + model in one local scope: the model's shims bind
            # to the bridge without either entering the process-wide scope
            self.wrapper_path = link_wrapper(model_link_group(self._bridge.path, self.so_path))
        except NativeBuildError as exc:
            raise AotiModelError(f"linking a loader for {self.so_path} failed: {exc}") from exc
        try:
            # PyDLL: keep the GIL across the call so the shim callbacks need not re-take it;
            # symbols are looked up in the wrapper's group, i.e. in the model
            self._lib = ctypes.PyDLL(str(self.wrapper_path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise AotiModelError(f"loading {self.so_path} failed: {exc}") from exc
        if executor is not None:
            self._proxy = ctx.register_proxy_executor(executor)
            self._serve_proxy_natively(text)
        self._blob_ptr, self._blob_owner = model_constants.aligned_blob(weights_blob, ctx.host)
        self._bind_api()
        ctx.model_opened(self)
        self._counted = True
        with ctx.run_lock:
            if ctx.running is not None:
                raise nested_run_error(self.so_path.name, ctx.running)
            ctx.running = self  # creation and constant loading follow this model's policy
            try:
                ctx.take_unchecked_error()
                # the container makes its constants now: natively borrowed records while
                # the native implementation serves (native_fallbacks)
                with ctx.native.borrowing(ctx.native.fallbacks):
                    self._create()
                try:
                    raise_unchecked(ctx, self.so_path.name, "loading the model")
                except BaseException:
                    self.close()
                    raise
            finally:
                ctx.running = None

    def _serve_proxy_natively(self, text: str | bytes) -> None:
        """On the native implementation, a host or mps model's proxy calls are served by
        the native executor (``proxy_native``), parsed once here; the Python executor stays
        registered for the calls it does not serve (and as the reference)."""
        if self.shims != "native" or not serves_device(self._device_type):
            return
        try:
            native = NativeProxyExecutor(text, self._device_type)
        except ExternNodeError as exc:
            self.context.unregister_proxy_executor(self._proxy)
            self._proxy = None
            raise AotiModelError(f"{self.so_path.name}: {exc}") from exc
        self._native_proxy = native
        self._bridge.serve_proxy(self._proxy, native)

    @property
    def weights_span(self) -> tuple[int, int]:
        """(address, bytes) of the weights blob the ``.so`` copies its constants from: the
        emulated device bounds ``aoti_torch_mps_memcpy``'s source by it."""
        return self._blob_ptr, 0 if self._blob_owner is None else len(self._blob_owner)

    def _bind_api(self) -> None:
        lib, vp, sz = self._lib, ctypes.c_void_p, ctypes.c_size_t
        sig = {
            "AOTInductorModelContainerCreateWithDevice": [vp, sz, ctypes.c_char_p, ctypes.c_char_p],
            "AOTInductorModelContainerDelete": [vp],
            "AOTInductorModelContainerRun": [vp, vp, sz, vp, sz, vp, vp],
            "AOTInductorModelContainerGetNumInputs": [vp, vp],
            "AOTInductorModelContainerGetNumOutputs": [vp, vp],
            "AOTInductorModelContainerGetNumConstants": [vp, vp],
            "AOTInductorModelContainerGetConstantsBlobSize": [vp, vp],
            "AOTInductorModelUpdateConstantsFromBlob": [vp, vp],
            "AOTInductorGetLastError": [vp],
        }
        for name, argtypes in sig.items():
            fn = getattr(lib, name, None)
            if fn is None:
                raise AotiModelError(f"{self.so_path.name} has no {name}: not an AOTI model")
            fn.argtypes, fn.restype = argtypes, ctypes.c_int32
        self._run_fn = lib.AOTInductorModelContainerRun

    def _check(self, rc: int, step: str) -> None:
        check_step(self._lib, self.context, self.so_path.name, rc, step)

    def _size(self, fn_name: str) -> int:
        out = ctypes.c_uint64()
        self._check(getattr(self._lib, fn_name)(self._container, ctypes.byref(out)), fn_name)
        return out.value

    def _create(self) -> None:
        self.context.clear_last_error()
        handle = ctypes.c_void_p()
        lib = self._lib
        self._check(
            lib.AOTInductorModelContainerCreateWithDevice(
                ctypes.byref(handle), 1, self.device.encode(), None
            ),
            "creating the model container",
        )
        self._container = handle
        try:
            self.num_inputs = self._size("AOTInductorModelContainerGetNumInputs")
            self.num_outputs = self._size("AOTInductorModelContainerGetNumOutputs")
            # the one-call steady run lends host inputs, or the inputs of the emulated Metal
            # device (host memory); other devices run the general way
            steady = (
                SteadyRun(
                    self.context,
                    ctypes.cast(self._run_fn, ctypes.c_void_p).value,
                    handle.value,
                    self.num_inputs,
                    self.num_outputs,
                    self._proxy,
                    self._device_type,
                )
                # a model with an extern-node table runs it when the native executor
                # serves its proxy calls; on the Python executor it runs the general way.
                # The emulated Metal device's inputs are host memory too
                if (self.device == CPU_DEVICE or self._device_type == DEVICE_MPS)
                and (self._proxy is None or self._native_proxy is not None)
                else None
            )
            self._runner = ModelRunner(
                self,
                container=handle,
                run_fn=self._run_fn,
                lib=self._lib,
                counter=self._bridge.counter,
                proxy=self._proxy,
                device_type=self._device_type,
                num_inputs=self.num_inputs,
                num_outputs=self.num_outputs,
                steady=steady,
            )
            self._install_fast_run()
            num_constants = self._size("AOTInductorModelContainerGetNumConstants")
            if self.constants is not None:
                self._constant_handles = model_constants.lend(self, num_constants)
            elif num_constants:
                model_constants.load_from_blob(self, num_constants)
        except BaseException:
            self.close()
            raise

    def _install_fast_run(self) -> None:
        """Serve ``run(inputs)`` by a ``FastRun`` once the steady run is armed: an instance
        attribute in front of the method, which it falls back to (``fast_run.install``)."""
        unchecked = self._unchecked_holders()
        if unchecked is not False:
            fast_run.install(self, self._runner, AotiModel._run_general, unchecked)

    def _unchecked_holders(self) -> tuple | None | bool:
        """What a ``FastRun`` reads a device's launch failures from: None on the host (a run
        there checks none, as ``ModelRunner.run_into``), the context's holders on a device,
        False when one of its devices keeps them where C cannot read (no fast run then)."""
        if self._device_type == DEVICE_CPU:
            return None
        holders = self.context.unchecked_holders()
        return False if holders is None else holders

    def fast_run(self, **kwargs) -> object | None:
        """A ``FastRun`` of this model for another caller (a ``.pte`` method's direct
        call): ``fast_run.build``'s keywords; None when the model runs the general way."""
        runner = self._runner
        unchecked = self._unchecked_holders()
        if runner is None or runner.steady is None or unchecked is False:
            return None
        return fast_run.build(runner.steady, self, unchecked=unchecked, **kwargs)

    def finish_fast(self, inputs: Sequence[torch.Tensor], rc: int, results: list) -> list:
        """``ModelRunner.finish_fast`` of this model (for a ``FastRun``'s ``finish``)."""
        return self._active_runner().finish_fast(inputs, rc, results)

    def stats(self) -> dict[str, dict[str, int]]:
        """Shim name -> {"native": calls served in C, "python": calls that reached Python},
        counted by the bridge of this model's context since it was loaded (every model of
        the context adds to it: take the difference around the runs to count)."""
        return {
            name: {"native": native, "python": python}
            for name, (native, python) in self._bridge.shim_counts().items()
        }

    def close(self) -> None:
        """Delete the container (its constants go with it) and forget the weights."""
        runner, self._runner = self._runner, None
        self._fast_call = None  # the FastRun that served run()
        if runner is not None and runner.steady is not None:
            runner.steady.armed.value = 0  # every FastRun over it declines from now on
        if self._container is not None:
            with self.context.run_lock:
                rc = self._lib.AOTInductorModelContainerDelete(self._container)
            self._container = None
            handles, self._constant_handles = self._constant_handles, []
            for h in handles:  # user-managed: the container never deletes them
                if self.context.is_live(h):
                    self.context.unregister(h)
            self._check(rc, "deleting the container")
        self._blob_owner = None
        self._blob_ptr = 0
        if self._proxy is not None:
            if self._native_proxy is not None:
                self._bridge.serve_proxy(self._proxy, None)
                self._native_proxy.close()
                self._native_proxy = None
            self.context.unregister_proxy_executor(self._proxy)
            self._proxy = None
        if getattr(self, "_counted", False):
            self._counted = False
            self.context.model_closed(self)

    def _active_runner(self) -> ModelRunner:
        runner = self._runner
        if runner is None:
            raise AotiModelError(f"{self.so_path.name}: model is closed")
        return runner

    def run(
        self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Run once (``ModelRunner.run``): inputs borrowed, new outputs or ``outputs`` filled."""
        fast = self._fast_call
        if fast is not None:  # it hands what it does not serve to _run_general
            return fast(inputs) if outputs is None else fast(inputs, outputs)
        return self._active_runner().run(inputs, outputs)

    def _run_general(
        self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """``run`` without the one-call path (its fallback)."""
        return self._active_runner().run(inputs, outputs)

    def run_into(
        self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor | None]:
        """Run once, writing results into ``outputs`` where they fit (``ModelRunner.run_into``)."""
        return self._active_runner().run_into(inputs, outputs)

    def __enter__(self) -> AotiModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self.close()
