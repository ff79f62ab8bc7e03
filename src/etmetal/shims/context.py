"""``ShimContext``: everything the shims share, as one object instead of module globals.

A context owns the handle table, the live storages, one allocator per device, the
bridge it serves (and so the bridge's native records and native tensors), the run
lock, the last error and the policy of the run in progress. Shim implementations
are plain functions ``fn(ctx, *c_args)``; the bridge binds each one to its context
when it builds the ctypes callbacks, so a shim reaches its state through ``ctx`` and
never through a module global.

``default_context()`` is the one the package-level helpers (``load_bridge``,
``memory_stats``, ``last_error``, ``c_api``) and ``AotiModel`` use unless given
another. A second ``ShimContext()`` is independent of it: its own handles, storages,
allocators, errors and policy, and its own copy of the trampoline (a private file,
so the dynamic loader gives it its own C records and native allocator). A model
``.so`` file binds to the context that loaded it first; load a copy of the file to
run the same model in another context.

Extension point for devices. A device (the emulated Metal device, ``mps``) is a
``Device``: its c10 device code, a factory for its allocator (each context gets its
own) and the shims only it needs, keyed by C name::

    MPS = Device("mps", DEVICE_CODES["mps"], MpsAllocator, shims={"aoti_torch_mps_x": impl})
    ctx = default_context()
    ctx.register_device(MPS)        # allocator for device code 13 + its shims
    other = ShimContext(devices=[MPS])  # the same, for a new context

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
from dataclasses import dataclass, field
from pathlib import Path

# tensor_shims, fallback_shims, getter_shims, proxy_executor and the emulated Metal device
# fill the shim table (registry.SHIMS) when imported
from etmetal.shims import (  # noqa: F401
    fallback_shims,
    getter_shims,
    native_tensors,
    proxy_executor,
    tensor_shims,
)
from etmetal.shims.abi_codes import DEVICE_CPU
from etmetal.shims.emulated_mps import mps_kernels  # noqa: F401
from etmetal.shims.emulated_mps.mps_device import DEVICE_MPS, MpsAllocator
from etmetal.shims.record_table import MemoryStats, Records

from .bridge import Bridge, BridgeError, CApi, build, generate_source
from .handles import HandleTable
from .registry import SHIMS
from .storage import Allocator, HostAllocator, ShimError, Storage, Tensor

MATERIALIZE_MODES = ("view", "upstream_copy")

# proxy executor handles (AOTIProxyExecutorHandle) are keys of the same kind, elsewhere
_PROXY_BASE = 0x7E71_0000_0000


def check_materialize(mode: str) -> str:
    if mode not in MATERIALIZE_MODES:
        raise ValueError(f"materialize must be one of {MATERIALIZE_MODES}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class Device:
    """A device shims can allocate on: c10 code, allocator factory, device-only shims."""

    name: str
    device_type: int
    make_allocator: Callable[[], Allocator]
    shims: Mapping[str, Callable] = field(default_factory=dict)


# devices every context has besides the host: the emulated Metal device (host memory
# standing for shared-storage MTLBuffers; its shims are in the shim table already)
BUILTIN_DEVICES = (Device("mps", DEVICE_MPS, MpsAllocator),)


class ShimContext(HandleTable):
    """The shims' state: handles, storages, allocators, bridge, run lock, error, policy."""

    def __init__(self, *, devices: Sequence[Device] = (), private_bridge: bool = True) -> None:
        """``devices``: registered at once (``register_device``), besides the host.
        ``private_bridge=False`` (the default context only) loads the cached trampoline
        in place; any other context loads a private copy so its C state is its own."""
        self.handles: dict[int, Tensor] = {}
        self.live_storages: dict[int, Storage] = {}  # id(storage) -> storage
        # native allocation (data address) -> the live Storage adopted views of it share
        self.native_storages: dict[int, Storage] = {}
        # one model runs at a time per context; ctypes callbacks hold the GIL, this orders
        # whole runs (and the policy of the run in progress)
        self.run_lock = threading.RLock()
        self.host = HostAllocator()
        self.host.policy_listeners.append(self.sync_native_policy)
        self.allocators: dict[int, Allocator] = {DEVICE_CPU: self.host}
        self.devices: dict[str, Device] = {}
        self.device_state: dict[str, object] = {}  # per-device tables (e.g. mps buffers)
        self.shims: dict[str, Callable] = dict(SHIMS)
        # "view": _reinterpret_tensor keeps views in the parent's storage (correct);
        # "upstream_copy": copy non-packed views into a new buffer (upstream Metal's behaviour).
        # The policy of shim calls made outside any model's run (``c_api``); a model's
        # calls follow the model's own ``materialize`` (``policy``).
        self.materialize = "view"
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
        self.records: Records | None = None
        self.native: native_tensors.NativeTensors | None = None
        self._private_bridge = private_bridge
        self._next_handle = itertools.count(1).__next__
        # AOTIProxyExecutorHandle -> the executor of one model's extern-node table
        self.proxy_executors: dict[int, proxy_executor.ProxyExecutor] = {}
        self._next_proxy = itertools.count(1).__next__
        self._load_lock = threading.Lock()
        for device in (*BUILTIN_DEVICES, *devices):
            self.register_device(device)

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
        allocator = device.make_allocator()
        self.register_shims(device.shims)
        self.register_allocator(device.device_type, allocator)
        self.devices[device.name] = device
        return allocator

    # --- the bridge -------------------------------------------------------------------------

    def load_bridge(self) -> Bridge:
        """Build (once per content) and load (once per context) this context's trampoline."""
        with self._load_lock:
            if self.bridge is None:
                path = build(generate_source(self.shims))
                if self._private_bridge:
                    path = _private_copy(self, path)
                self.bridge = Bridge(path, self)
            return self.bridge

    def attach_native(self, records: Records, native: native_tensors.NativeTensors) -> None:
        """Called by the bridge once loaded: its record table and native tensors."""
        self.records, self.native = records, native
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
        native.set_views(not copying)

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

    # --- proxy executors --------------------------------------------------------------------

    def register_proxy_executor(self, executor: proxy_executor.ProxyExecutor) -> int:
        """A new ``AOTIProxyExecutorHandle`` for ``executor`` (what a model's runs pass)."""
        handle = _PROXY_BASE + (self._next_proxy() << 4)
        self.proxy_executors[handle] = executor
        return handle

    def unregister_proxy_executor(self, handle: int) -> None:
        self.proxy_executors.pop(handle, None)

    def proxy_executor(self, handle: int | None) -> proxy_executor.ProxyExecutor:
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


# the one process-wide object of the shims: what the package-level helpers act on
_DEFAULT = ShimContext(private_bridge=False)


def default_context() -> ShimContext:
    return _DEFAULT


# the package-level helpers: the default context's
def load_bridge(ctx: ShimContext | None = None) -> Bridge:
    """Build (once per content) and load (once per context) the trampoline; returns the
    bridge of ``ctx`` (the default context when None)."""
    return (ctx or _DEFAULT).load_bridge()


def c_api(ctx: ShimContext | None = None) -> CApi:
    """The shims of ``ctx`` (default: the default context) under their C names."""
    return CApi(ctx or _DEFAULT)


def memory_stats() -> MemoryStats:
    return _DEFAULT.memory_stats()


def last_error() -> str:
    """The message of the default context's most recent failed shim call."""
    return _DEFAULT.error


def clear_last_error() -> None:
    _DEFAULT.error = ""


def set_materialize(mode: str) -> str:
    return _DEFAULT.set_materialize(mode)


def register_allocator(allocator: Allocator) -> None:
    """Make ``empty_strided`` on ``allocator.device_type`` allocate through ``allocator`` in
    the default context."""
    _DEFAULT.register_allocator(allocator.device_type, allocator)
