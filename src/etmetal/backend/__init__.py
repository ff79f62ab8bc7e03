"""Ahead-of-time: ``MetalBackend.preprocess`` (AOTInductor compilation of one partition,
cached by content, packed into the program's named data), the per-target capability check
the partitioner asks, the graph passes and ``backend_config()``, and ``lower()``, the
export-partition-lower helper. Never imports the runtime."""
