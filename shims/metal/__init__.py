"""The emulated Metal device: ``mps`` storage in host memory, the ``shim_mps.h`` ABI, MSL on the CPU."""
