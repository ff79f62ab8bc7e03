"""The emulated Metal device's kernels: Metal Shading Language compiled and run on the CPU.

``msl`` is the API (``compile_library`` -> ``MslLibrary.function`` -> ``MslFunction.dispatch``,
``MslError``); ``msl_compiler``/``msl_parse`` turn a library's source into a shared object
with ``msl_compat.h``; ``msl_classify`` finds the kernels that never synchronise (they run as
plain loops); ``msl_dispatch.cpp`` runs a kernel with Metal's threadgroup, barrier and
SIMD-group semantics, ``msl_pool.cpp`` spreads its threadgroups over the intra-op threads.

The device around them: ``mps_device`` (``mps`` storage and the raw buffers of
``shim_mps.h``), ``mps_kernels`` (shader libraries, kernel functions, encoding, dispatch),
``bridge_source`` (the command-block callback, native, compiled into the shim bridge).

The checker: ``check`` (modes and faults), ``msl_instrument`` (a library's checked build),
``msl_check.cpp`` (bounds, threadgroup shadow, aliasing); ``mps_device.set_metal_check`` /
``check_report`` or ``ETMETAL_METAL_CHECK`` switch it on.
"""

from etmetal.shims.emulated_mps.check import MetalFault
from etmetal.shims.emulated_mps.msl import (
    MetalCheckError,
    MslError,
    MslFunction,
    MslLibrary,
    compile_library,
)

__all__ = [
    "MetalCheckError",
    "MetalFault",
    "MslError",
    "MslFunction",
    "MslLibrary",
    "compile_library",
]
