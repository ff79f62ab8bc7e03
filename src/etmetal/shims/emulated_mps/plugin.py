"""The emulated Metal device as a plug-in: ``register(ctx)`` gives a context ``mps`` storage,
the ``shim_mps.h`` shims, the check for the kernel failures the Metal wrapper ignores and
the native command-block code its trampoline compiles in.

Nothing registers it by being imported: the code that wants the device calls ``register``
(``standard_context`` does, for the default context and every standard one) or passes
``DEVICE`` to ``ShimContext(devices=[...])``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etmetal.common.targets import METAL_DEVICE
from etmetal.shims.device import BridgeSource, Device
from etmetal.shims.storage import Allocator

from . import bridge_source, mps_device, mps_kernels

if TYPE_CHECKING:
    from etmetal.shims.context import ShimContext

DEVICE = Device(
    METAL_DEVICE,
    mps_device.DEVICE_MPS,
    mps_device.MpsAllocator,
    shims={**mps_device.SHIMS, **mps_kernels.SHIMS},
    take_unchecked_error=mps_device.take_unchecked_error,
    unchecked_holder=mps_device.mps_state,  # MpsState.unchecked_error
    # mps buffers are host memory: the bridge's native tensors serve them too
    host_memory=mps_device.plain_memory,
    attach=bridge_source.attach,
    # the command-block callback runs in C (the C++ std::function never reaches Python)
    bridge_source=BridgeSource(
        includes=bridge_source.INCLUDES,
        code=bridge_source.c_source(),
        native_paths=bridge_source.NATIVE_PATHS,
        native_only=bridge_source.NATIVE_ONLY,
    ),
)


def register(ctx: ShimContext) -> Allocator:
    """Register the emulated Metal device on ``ctx``; returns its new ``mps`` allocator."""
    return ctx.register_device(DEVICE)
