"""``Device``: what a device plug-in gives a ``ShimContext`` (see ``context``).

A device is its c10 device code, a factory for its allocator (each context gets its own),
the shims only it needs, keyed by C name, optionally the check a run makes afterwards
for failures the ``.so`` could not see (the Metal wrapper ignores the return codes of its
kernel calls), and optionally the C++ it compiles into its context's trampoline
(``BridgeSource``). The context knows devices only through this record, so a plug-in such as
the emulated Metal device (``emulated_mps.register``) never needs the context module and
the context never imports a plug-in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .storage import Allocator


@dataclass(frozen=True)
class BridgeSource:
    """C++ a device adds to the trampoline (``bridge``) of every context it is registered on."""

    includes: str = ""  # #include lines the code needs
    code: str = ""  # definitions, compiled inside the trampoline's extern "C" block
    # forwarded shim -> the native body that runs first (Python's shim validates through
    # the shim's etm_fp_ pointer); the code defines what these bodies call
    native_paths: Mapping[str, str] = field(default_factory=dict)
    # shims declared in torch's headers that ``code`` defines natively, with no Python half
    native_only: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Device:
    """A device shims can allocate on: c10 code, allocator factory, device-only shims."""

    name: str
    device_type: int
    make_allocator: Callable[[], Allocator]
    shims: Mapping[str, Callable] = field(default_factory=dict)
    # ``take_unchecked_error(ctx)``: the failure the .so ignored since the last call ("" if
    # none), cleared; a run that ends with one fails
    take_unchecked_error: Callable[[object], str] | None = None
    # ``unchecked_holder(ctx)``: the object whose ``unchecked_error`` attribute (a str, ""
    # when none) is what ``take_unchecked_error`` takes, so the one-call run (``fast_run``)
    # can read it in C around a run; None: such a device's runs always take the Python path
    unchecked_holder: Callable[[object], object] | None = None
    bridge_source: BridgeSource | None = None
    # ``host_memory(ctx)``: True while the device's memory in ``ctx`` is plain host memory
    # the bridge's native tables may allocate and lend (its allocator still the one the
    # device made, with no fill byte: ``ShimContext.sync_native_policy``); None: never
    host_memory: Callable[[object], bool] | None = None
    # ``attach(ctx)``: called once the context's bridge is loaded, so the device's native
    # code gets what only Python knows (torch's own rules, read at run time)
    attach: Callable[[object], None] | None = None
