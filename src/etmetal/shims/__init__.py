"""The AOTI C-shim ABI (``aoti_torch_*``) in Python, and the bridge a compiled ``.so`` calls.

Object model (see ``storage``/``context``): a ``Storage`` is one allocation through an
``Allocator`` (``host``: aligned host memory) or a borrowed blob (never freed), with
a count of the tensors on it; a ``Tensor`` is storage + dtype + sizes + any strides
+ storage offset; an ``AtenTensorHandle`` is an opaque integer keying the handle
table. ``_reinterpret_tensor`` keeps views, packed or not, in the parent's storage,
so kernels that write through views with holes (``chunk``/``split`` + ``cat``) work;
``materialize="upstream_copy"`` reproduces upstream Metal's always-copy behaviour.
The emulated Metal device (``emulated_mps``) adds ``mps`` storage (c10 device type 13, host
memory like Apple's shared-storage buffers) and the ``shim_mps.h`` ABI, so an
``mps_emulated`` ``.so`` runs with ``AotiModel`` on the ``mps`` device: its Metal kernels on
the CPU (``emulated_mps.msl``), its ``aoti_torch_mps_*`` fallbacks on ATen over the same memory.
The bridge serves the hottest shims itself (``native_tensors``): getters from a
per-handle record, ``empty_strided``/``delete`` of host tensors up to 1 MiB from a
size-keyed cache; Python adopts such a tensor the first time another shim touches
it. After a model's first run, ``steady_run`` makes each run one call into C.

Running a model (what the Metal delegate does)::

    from etmetal.shims import AotiModel, memory_stats

    model = AotiModel(so_path, weights_blob)  # blob: bytes | memoryview, kept until close
    outs = model.run([x])                     # inputs borrowed, no copy; outputs new tensors
    model.run([x], outputs=[y])               # results copied into caller tensors (resized
                                              # if the shape changed)
    model.close()                             # container, constants and memory released
    assert memory_stats().storages == 0       # .bytes: live owned bytes; .cached_bytes: freed
                                              # host buffers kept for reuse (emptied when the
                                              # last model closes)

``AotiModel`` builds and loads the trampoline on first use (``load_bridge()``),
checks that every ``aoti_torch_*`` symbol the ``.so`` needs is exported, and
raises ``BridgeError`` if a run's shim calls did not reach etmetal. A ``.so``
compiled by etmetal validates each input's dtype, sizes, strides and device itself
(compiled in; no environment variable is read or written). Failures (a shim error, a kernel's bounds check) surface
as ``AotiModelError`` with the model's message and ``last_error()``; a failed run
leaks no handles and the model stays usable. Runs are serialized by their context's
run lock; the ``.so``'s OpenMP kernels use torch's intra-op thread count.

All shim state (handles, storages, allocators per device, the bridge, the last error,
the policy) lives in a ``ShimContext`` (``context``). A bare ``ShimContext()`` has no
shims; ``standard_context()`` (``standard_context``) registers etmetal's shims and the
emulated Metal device (``emulated_mps.plugin.register``) by explicit calls, and
``default_context()``, one such context, serves the helpers below and every ``AotiModel``
not given ``context=``. Devices plug in through ``ctx.register_device(Device(...))``.

Calling a shim exactly as a ``.so`` does (C calling convention, ctypes out-pointers)::

    lib = c_api()
    h = ctypes.c_void_p()
    rc = lib.aoti_torch_empty_strided(1, sizes, strides, 6, 0, 0, ctypes.byref(h))
    # rc == 0 (AOTI_TORCH_SUCCESS) or 1 (AOTI_TORCH_FAILURE, message in last_error())
"""

from __future__ import annotations

from etmetal.shims.record_table import MemoryStats

from .bridge import Bridge, BridgeError
from .context import ShimContext
from .device import Device
from .model import AotiModel, AotiModelError
from .standard_context import (
    c_api,
    clear_last_error,
    default_context,
    last_error,
    load_bridge,
    memory_stats,
    register_allocator,
    set_materialize,
    standard_context,
    standard_shims,
)
from .storage import Allocator, HostAllocator, ShimError, Storage, Tensor

# the default context's host allocator (fill_byte, empty_cache(), cached_bytes)
HOST_ALLOCATOR = default_context().host

AOTI_TORCH_SUCCESS = 0
AOTI_TORCH_FAILURE = 1

__all__ = [
    "AOTI_TORCH_FAILURE",
    "AOTI_TORCH_SUCCESS",
    "Allocator",
    "AotiModel",
    "AotiModelError",
    "Bridge",
    "BridgeError",
    "Device",
    "HOST_ALLOCATOR",
    "HostAllocator",
    "MemoryStats",
    "ShimContext",
    "ShimError",
    "Storage",
    "Tensor",
    "c_api",
    "clear_last_error",
    "default_context",
    "last_error",
    "load_bridge",
    "memory_stats",
    "register_allocator",
    "set_materialize",
    "standard_context",
    "standard_shims",
]
