"""Ahead-of-time: ``MetalBackend.preprocess`` (AOTInductor compilation of one partition,
cached by content, packed into the program's named data), ``MetalPartitioner`` and the
per-target capability check it asks, the graph passes, and ``lower()``, the
export-partition-lower helper. Never imports the runtime.

Importing this package registers torchao's low-bit operators where torchao's MPS library
is missing (:mod:`etmetal.backend.torchao_ops`): a user quantizes with torchao's
``UIntxWeightOnlyConfig`` after ``import etmetal.backend`` and before ``quantize_``, and
every module below (the partitioner among them) can rely on the operators existing.
"""

from etmetal.backend.torchao_ops import register as _register_torchao_ops

_register_torchao_ops()
