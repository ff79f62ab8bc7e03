"""etmetal's MetalBackend for the stock ExecuTorch runtime (``executorch.runtime``).

``register()`` builds and loads ``libetmetal_stock.so``, a native
``executorch::runtime::BackendInterface`` registered as "MetalBackend": the stock
runtime's ``Method`` then runs a ``host`` or ``mps_emulated`` delegate's AOTI ``.so`` through
etmetal's native shims (the same C the Python runtime's fast path uses), with no Python call
in a run; an ``mps_emulated`` delegate's shader libraries come verified from the stock
shader index (``stock_mps.cpp``, ``shims/emulated_mps/stock_msl.py``).

- ``init`` reads the processed bytes and the named data through the runtime's named-data
  map, checks each blob against the sha256 in its key, applies etmetal's trust policy,
  writes the ``.so`` into a private 0700 directory, loads it through a link wrapper
  (``stock_loader.cpp``: no compiler at load, no ``aoti_torch_*`` in the global scope),
  creates the container on the cpu and gives it its weights (the one blob, or the
  weights index's constants lent in place and shared by the program's methods).
- ``execute`` lends the runtime's input tensors as native borrowed records, runs the
  container (``etm_run``) and copies each output into its planned tensor, resizing a
  dynamic one through ``executorch::runtime::resize_tensor``; it reports itself to the
  event tracer.
- ``destroy`` deletes the container, frees the records and removes the directory.

Refused at init with an ExecuTorch error and a logged message: untrusted native code,
altered blobs, an ``mps`` delegate (macOS only) and a ``.so`` that needs the proxy executor.
"""

from .register import (
    LentConstant,
    StockRuntimeError,
    header_path,
    last_error,
    lent_constants,
    library_path,
    native_counts,
    register,
    shim_calls,
)

__all__ = [
    "LentConstant",
    "StockRuntimeError",
    "header_path",
    "last_error",
    "lent_constants",
    "library_path",
    "native_counts",
    "register",
    "shim_calls",
]
