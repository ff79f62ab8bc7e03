"""The emulated Metal device's kernels: Metal Shading Language compiled and run on the CPU.

``msl`` is the API (``compile_library`` -> ``MslLibrary.function`` -> ``MslFunction.dispatch``,
``MslError``); ``msl_compiler``/``msl_parse`` turn a library's source into a shared object
with ``msl_compat.h``; ``msl_dispatch.cpp`` runs a kernel with Metal's threadgroup, barrier and
SIMD-group semantics.

The device around them: ``mps_device`` (``mps`` storage and the raw buffers of
``shim_mps.h``), ``mps_kernels`` (shader libraries, kernel functions, encoding, dispatch),
``bridge_source`` (the command-block callback, native, compiled into the shim bridge).
"""

from etmetal.shims.emulated_mps.msl import MslError, MslFunction, MslLibrary, compile_library

__all__ = ["MslError", "MslFunction", "MslLibrary", "compile_library"]
