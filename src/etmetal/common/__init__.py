"""Leaf modules that every other part may import; they import nothing of the project
(``shims/`` may import only this). Facts shared by the ahead-of-time side and the runtime
side live here once: the delegate blob wire format (``delegate_blobs``), the c10 scalar
type table (``dtypes``), the fallback-shim table the partitioner and the shim registry
derive from (``fallbacks``), the custom operators' C-shim declarations (``custom_ops``),
torchao's low-bit weight format and reference linear (``lowbit``), and the
content-addressed cache of build products (``cache``)."""
