"""The contexts etmetal builds: its standard shims plus the emulated Metal device, and the
process-wide default context the package-level helpers act on.

This module is where the pieces meet, by explicit calls: each shim module hands over its
own table (``tensor_shims.SHIMS``, ...) and the emulated device registers itself
(``emulated_mps.plugin.register``). Nothing below this module imports it, so the
context, the shim modules and the device plug-in stay free of one another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from etmetal.shims.emulated_mps import plugin as emulated_mps
from etmetal.shims.record_table import MemoryStats

from . import fallback_shims, getter_shims, proxy_executor, tensor_shims
from .bridge import Bridge, CApi
from .context import ShimContext
from .device import Device
from .storage import Allocator

# the modules whose shims every standard context implements, in this order
_SHIM_MODULES = (tensor_shims, getter_shims, fallback_shims, proxy_executor)


def standard_shims() -> dict[str, Callable]:
    """C name -> implementation for every host shim etmetal implements (a new dict)."""
    shims: dict[str, Callable] = {}
    for module in _SHIM_MODULES:
        shims.update(module.SHIMS)
    return shims


def standard_context(*, devices: Sequence[Device] = (), private_bridge: bool = True) -> ShimContext:
    """A ``ShimContext`` with etmetal's shims, the emulated Metal device, then ``devices``."""
    ctx = ShimContext(shims=standard_shims(), private_bridge=private_bridge)
    emulated_mps.register(ctx)
    for device in devices:
        ctx.register_device(device)
    return ctx


# the one process-wide object of the shims: what the package-level helpers act on
_DEFAULT = standard_context(private_bridge=False)


def default_context() -> ShimContext:
    return _DEFAULT


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
