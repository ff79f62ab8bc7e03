"""``ShimContext``: everything the shims share, as one object instead of module globals.

A context owns the handle table (``handles.HandleTable``, a collaborator), the live
storages, one allocator per device, the shim table, the bridge it serves (and so the
bridge's native records and native tensors), the run lock, the last error and the policy
of the run in progress. Shim implementations are plain functions ``fn(ctx, *c_args)``;
the bridge binds each one to its context when it builds the ctypes callbacks, so a shim
reaches its state through ``ctx`` and never through a module global.

A bare ``ShimContext()`` implements no shim and knows only the host device: shims and
devices arrive through explicit calls, never by importing a module.
``standard_context()`` (``standard_context``) builds one with etmetal's shims and the
emulated Metal device, and ``default_context()`` is the process-wide one the package-level
helpers and ``AotiModel`` use unless given another. Each context is independent: its own
handles, storages, allocators, errors and policy, and (unless it is the default one) its
own copy of the trampoline (a private file, so the dynamic loader gives it its own C
records and native allocator). A model ``.so`` file binds to the context that loaded it
first; load a copy of the file to run the same model in another context.

Extension point for devices. A device is a ``Device`` (``device``): its c10 device code,
a factory for its allocator (each context gets its own), the shims only it needs, keyed
by C name, and the check for failures the ``.so`` ignores::

    MPS = Device(METAL_DEVICE, DEVICE_MPS, MpsAllocator, shims={"aoti_torch_mps_x": impl})
    ctx.register_device(MPS)              # allocator for device code 13 + its shims
    other = ShimContext(devices=[MPS])    # the same, for a new context

A device shim is called as ``impl(ctx, *c_args)`` with the context it was registered
on, like every shim (``registry``).

``register_allocator(device_type, allocator)`` and ``register_shims({...})`` do the
two halves separately. Shims are best registered before the context's bridge is
loaded (the trampoline is generated from the context's shim table); afterwards only
names the trampoline already forwards can be re-bound, anything else is a
``BridgeError`` naming them.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from etmetal.shims.abi_codes import DEVICE_CPU, DEVICE_MPS
from etmetal.shims.record_table import Records

from . import native_custom_ops, native_tensors
from .bridge import Bridge, BridgeError, build, generate_source
from .device import BridgeSource, Device
from .handles import HandleTable
from .native_fallbacks import check_implementation
from .storage import Allocator, HostAllocator, ShimError

__all__ = ["MATERIALIZE_MODES", "Device", "ExternNodeRunner", "ShimContext", "check_materialize"]

MATERIALIZE_MODES = ("view", "upstream_copy")

# proxy executor handles (AOTIProxyExecutorHandle) are keys of the same kind, elsewhere
_PROXY_BASE = 0x7E71_0000_0000


def check_materialize(mode: str) -> str:
    if mode not in MATERIALIZE_MODES:
        raise ValueError(f"materialize must be one of {MATERIALIZE_MODES}, got {mode!r}")
    return mode


class ExternNodeRunner(Protocol):
    """What a context keeps per ``AOTIProxyExecutorHandle`` (``proxy_executor.ProxyExecutor``
    is the one etmetal has; the context only stores it and hands it back)."""

    def call(self, ctx: ShimContext, index, num_ints, ints_ptr, num_tensors, tensors_ptr) -> None:
        """Run extern node ``index`` with the C arguments of the proxy call."""


class ShimContext:
    """The shims' state: handles, storages, allocators, bridge, run lock, error, policy."""

    def __init__(
        self,
        *,
        shims: Mapping[str, Callable] | None = None,
        devices: Sequence[Device] = (),
        private_bridge: bool = True,
    ) -> None:
        """``shims``: C name -> ``fn(ctx, *c_args)``, registered at once (``register_shims``);
        ``devices``: registered at once (``register_device``), besides the host.
        ``private_bridge=False`` (the default context only) loads the cached trampoline
        in place; any other context loads a private copy so its C state is its own."""
        # one model runs at a time per context; ctypes callbacks hold the GIL, this orders
        # whole runs (and the policy of the run in progress)
        self.run_lock = threading.RLock()
        self.host = HostAllocator()
        # the handle table is a collaborator; its hot methods are bound here once, so a shim
        # calls ``ctx.lookup(h)`` at the cost of a plain method call
        self.handle_table = table = HandleTable(self.host)
        self.handles = table.handles
        self.live_storages = table.live_storages
        self.native_storages = table.native_storages
        self.lookup = table.lookup
        self.register = table.register
        self.unregister = table.unregister
        self.rebind = table.rebind
        self.emit = table.emit
        self.is_live = table.is_live
        self.memory_stats = table.memory_stats
        self.host.policy_listeners.append(self.sync_native_policy)
        self.allocators: dict[int, Allocator] = {DEVICE_CPU: self.host}
        self.devices: dict[str, Device] = {}
        # device type -> the allocator its device made (a replaced one ends native serving)
        self._device_allocators: dict[int, Allocator] = {}
        self.device_state: dict[str, object] = {}  # per-device tables (e.g. mps buffers)
        self.shims: dict[str, Callable] = {}
        # "view": _reinterpret_tensor keeps views in the parent's storage (correct);
        # "upstream_copy": copy non-packed views into a new buffer (upstream Metal's behaviour).
        # The policy of shim calls made outside any model's run (``c_api``); a model's
        # calls follow the model's own ``materialize`` (``policy``).
        self.materialize = "view"
        # which implementation serves this context's shims: "native" (C where it can,
        # native_fallbacks) or "python" (the reference); a model loaded with
        # shims="python" makes it "python" while the model is open
        self.implementation = "native"
        # the model whose container call is in progress (its run, or its creation and
        # constant load), None between them: part of the run's record. Shims read the
        # policy from it (``running.materialize``); nothing context-wide is swapped
        self.running: object | None = None
        self.grad_enabled = False
        self.error = ""  # message of the most recent failed shim call
        self.errors = 0
        self.open_models = 0  # models not yet closed; caches are emptied when none are left
        # the open models themselves (weakly: a dropped model closes in its finalizer),
        # so the exit hook can delete their containers while the shims still answer
        self._open_model_set: weakref.WeakSet = weakref.WeakSet()
        self.bridge: Bridge | None = None
        self._private_bridge = private_bridge
        # AOTIProxyExecutorHandle -> the executor of one model's extern-node table
        self.proxy_executors: dict[int, ExternNodeRunner] = {}
        self._next_proxy = itertools.count(1).__next__
        self._load_lock = threading.Lock()
        if shims:
            self.register_shims(shims)
        for device in devices:
            self.register_device(device)

    @property
    def records(self) -> Records | None:
        """The bridge's native record table (None until the bridge is loaded)."""
        return self.handle_table.records

    @property
    def native(self) -> native_tensors.NativeTensors | None:
        """The bridge's native tensors (None until the bridge is loaded)."""
        return self.handle_table.native

    # --- devices ----------------------------------------------------------------------------

    def register_allocator(self, device_type: int, allocator: Allocator) -> None:
        """Make ``empty_strided`` on ``device_type`` allocate through ``allocator``."""
        if allocator.device_type != device_type:
            raise ValueError(
                f"allocator {type(allocator).__name__} serves device type "
                f"{allocator.device_type}, not {device_type}"
            )
        self.allocators[device_type] = allocator
        self.sync_native_policy()

    def allocator(self, device_type: int, device_index: int = 0) -> Allocator:
        alloc = self.allocators.get(device_type)
        if alloc is None:
            raise ShimError(f"device type {device_type} has no allocator on this host")
        if device_index not in (0, -1):
            raise ShimError(f"device index {device_index} does not exist (only 0)")
        return alloc

    def register_shims(self, shims: Mapping[str, Callable]) -> None:
        """Implement the C symbols ``shims`` names with ``fn(ctx, *c_args)`` in this context."""
        bridge = self.bridge
        if bridge is not None:
            unknown = sorted(n for n in shims if n not in bridge.forwarded)
            if unknown:
                raise BridgeError(
                    f"the trampoline of this context is loaded and does not forward {unknown}; "
                    "register these shims before the first load_bridge()/AotiModel"
                )
            for name, fn in shims.items():
                bridge.bind(name, fn)
        self.shims.update(shims)

    def register_device(self, device: Device) -> Allocator:
        """Register ``device``'s allocator (a new one for this context) and its shims."""
        if device.bridge_source is not None and self.bridge is not None:
            raise BridgeError(
                f"device {device.name!r} compiles native code into the trampoline, and this "
                "context's trampoline is loaded; register it before the first "
                "load_bridge()/AotiModel"
            )
        allocator = device.make_allocator()
        self.register_shims(device.shims)
        self.devices[device.name] = device
        self._device_allocators[device.device_type] = allocator
        listeners = getattr(allocator, "policy_listeners", None)
        if listeners is not None:  # a fill byte on its memory: every allocation in Python
            listeners.append(self.sync_native_policy)
        self.register_allocator(device.device_type, allocator)
        return allocator

    # --- the bridge -------------------------------------------------------------------------

    def load_bridge(self) -> Bridge:
        """Build (once per content) and load (once per context) this context's trampoline."""
        with self._load_lock:
            if self.bridge is None:
                path = build(generate_source(self.shims, self.bridge_sources()))
                if self._private_bridge:
                    path = _private_copy(self, path)
                self.bridge = Bridge(path, self)
            return self.bridge

    def bridge_sources(self) -> list[BridgeSource]:
        """The native code compiled into this context's trampoline: the custom operators'
        paths (``native_custom_ops``), then the registered devices'."""
        devices = [d.bridge_source for d in self.devices.values() if d.bridge_source is not None]
        return [native_custom_ops.BRIDGE_SOURCE, *devices]

    def attach_native(self, records: Records, native: native_tensors.NativeTensors) -> None:
        """Called by the bridge once loaded: its record table and native tensors."""
        self.handle_table.records, self.handle_table.native = records, native
        for device in self.devices.values():
            if device.attach is not None:
                device.attach(self)
        self.sync_native_policy()

    def sync_native_policy(self) -> None:
        """Serve allocations natively only while host memory is plain: a poisoning fill byte
        or a replaced host allocator must see every allocation."""
        native = self.native
        if native is None:
            return
        plain = self.host.fill_byte is None and self.allocators.get(DEVICE_CPU) is self.host
        native.set_limit(native_tensors.NATIVE_LIMIT if plain else 0)
        # views in C follow the "view" policy; while a model that materializes is open (or
        # the context's own policy says so), every _reinterpret_tensor goes to Python, which
        # reads the policy of the run in progress
        copying = self.materialize != "view" or any(
            getattr(m, "materialize", "view") != "view" for m in self._open_model_set
        )
        # the reference implementation: while a model that runs on the Python shims is
        # open, every shim of this context goes to Python (native.set_fallbacks: the
        # fallbacks and constants of native_fallbacks; allocations and views above)
        python = self.implementation == "python" or any(
            getattr(m, "shims", "native") == "python" for m in self._open_model_set
        )
        if python:
            native.set_limit(0)
        native.set_views(not copying and not python)
        native.set_fallbacks(not copying and not python)
        # the emulated Metal device's tensors and fallbacks (device 13, host memory) in C
        # only while the device says its memory is plain and no materializing or Python
        # model is open: the Python device and the native tables then agree on every byte
        native.set_mps_limit(
            native_tensors.NATIVE_MPS_LIMIT
            if not copying and not python and self._plain_device_memory(DEVICE_MPS)
            else 0
        )

    def _plain_device_memory(self, device_type: int) -> bool:
        alloc = self.allocators.get(device_type)
        if alloc is None or alloc is not self._device_allocators.get(device_type):
            return False
        if getattr(alloc, "fill_byte", None) is not None:
            return False
        return any(
            d.device_type == device_type and d.host_memory is not None and d.host_memory(self)
            for d in self.devices.values()
        )

    def model_opened(self, model: object | None = None) -> None:
        """``model`` (anything with ``close()``) is closed by ``close_models`` if still open."""
        self.open_models += 1
        if model is not None:
            self._open_model_set.add(model)
        if self.native is not None:
            self.native.set_caching(True)
            self.sync_native_policy()

    def model_closed(self, model: object | None = None) -> None:
        """The last open model of this context empties its host and native caches."""
        self._open_model_set.discard(model)
        self.open_models -= 1
        self.sync_native_policy()
        if self.open_models == 0:
            self.host.empty_cache()
            if self.native is not None:
                self.native.set_caching(False)

    def close_models(self, timeout: float = 5.0) -> int:
        """Close every model still open (the exit hook: their containers must be deleted
        while the shims are bound, not by finalizers after). Returns how many it closed.

        A run still going on another thread (a daemon thread at exit) holds the run lock;
        after ``timeout`` seconds the models are left open rather than hang the exit (the
        trampoline then answers their later deletes in C)."""
        if not self.run_lock.acquire(timeout=timeout):
            return 0
        closed = 0
        try:
            for model in list(self._open_model_set):
                try:
                    model.close()
                    closed += 1
                except Exception:  # noqa: BLE001 - one failing model must not keep the others
                    self._open_model_set.discard(model)
        finally:
            self.run_lock.release()
        return closed

    # --- errors and policy ------------------------------------------------------------------

    def take_unchecked_error(self) -> str:
        """The first failure a device saw that the ``.so`` ignored since the last call ("" if
        none); every device's record is cleared."""
        messages = [
            device.take_unchecked_error(self)
            for device in self.devices.values()
            if device.take_unchecked_error is not None
        ]
        return next((m for m in messages if m), "")

    def unchecked_holders(self) -> tuple | None:
        """The objects whose ``unchecked_error`` attributes hold what
        :meth:`take_unchecked_error` takes, one per device that has such a record; None
        when a device keeps its record where C cannot read it (no ``unchecked_holder``)."""
        holders = []
        for device in self.devices.values():
            if device.take_unchecked_error is None:
                continue
            if device.unchecked_holder is None:
                return None
            holders.append(device.unchecked_holder(self))
        return tuple(holders)

    def last_error(self) -> str:
        """The message of the most recent failed shim call ("" if none failed yet)."""
        return self.error

    def clear_last_error(self) -> None:
        self.error = ""

    def record_error(self, shim: str, message: str) -> None:
        self.error = f"{shim}: {message}"
        self.errors += 1

    def set_materialize(self, mode: str) -> str:
        """Set how ``_reinterpret_tensor`` treats non-packed views outside model runs (each
        ``AotiModel`` runs with its own policy); returns the previous mode."""
        previous, self.materialize = self.materialize, check_materialize(mode)
        self.sync_native_policy()
        return previous

    def set_implementation(self, shims: str) -> str:
        """Serve this context's shims natively ("native") or all in Python ("python", the
        reference), for every model of the context; returns the previous choice."""
        previous, self.implementation = self.implementation, check_implementation(shims)
        self.sync_native_policy()
        return previous

    # --- proxy executors --------------------------------------------------------------------

    def register_proxy_executor(self, executor: ExternNodeRunner) -> int:
        """A new ``AOTIProxyExecutorHandle`` for ``executor`` (what a model's runs pass)."""
        handle = _PROXY_BASE + (self._next_proxy() << 4)
        self.proxy_executors[handle] = executor
        return handle

    def unregister_proxy_executor(self, handle: int) -> None:
        self.proxy_executors.pop(handle, None)

    def proxy_executor(self, handle: int | None) -> ExternNodeRunner:
        if not handle:
            raise ShimError(
                "proxy_executor is NULL: the model was loaded without its extern-node table, "
                "so operators without a C shim cannot run (load it with extern_nodes=...)"
            )
        executor = self.proxy_executors.get(handle)
        if executor is None:
            raise ShimError(f"proxy_executor {handle:#x} is not a live proxy executor")
        return executor


def _private_copy(ctx: ShimContext, path: Path) -> Path:
    """A copy of the trampoline only ``ctx`` loads: a distinct file is a distinct object to
    the dynamic loader, with its own globals (records, native allocator, call counter)."""
    folder = Path(tempfile.mkdtemp(prefix="etmetal-ctx-"))
    weakref.finalize(ctx, shutil.rmtree, folder, True)  # the mapping outlives the file
    copy = folder / path.name
    shutil.copy2(path, copy)
    return copy
