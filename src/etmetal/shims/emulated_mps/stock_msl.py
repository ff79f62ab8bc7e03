"""Compiled shader libraries for a process without Python: the stock runtime's shader index.

etmetal's MetalBackend for the stock ExecuTorch runtime (``stock_runtime/stock_mps.cpp``)
creates an ``mps_emulated`` delegate's shader libraries in C. Turning MSL into a shared
object takes this package's Python compiler (``msl_compiler``), so every library it
builds is also published here: a small text record, keyed by the source and the
compiler's own build inputs, that names the library file, its sha256 and each kernel's
launch facts, with an HMAC under the cache root's secret (``common.cache.root_mac``). The
native side reads only records whose MAC verifies, in a private root, and loads only a
file whose sha256 is the one recorded, so what it runs is exactly what this compiler
built from that source.

On a miss the native side runs ``python -m etmetal.shims.emulated_mps.stock_msl_compile SOURCE``
(the interpreter ``register`` or ``etmetal run --native`` names), which compiles the
library into the content cache and publishes its record; the native process then reads
it like any other. Record format (ASCII lines)::

    etmetal-msl-stock/1
    toolchain <hex>                  what shaped the build (``toolchain_digest``)
    library <absolute path of libmsl.so in the cache>
    sha256 <hex of that file>
    kernel <i> <limit> <loop 0|1> <buffer indices a,b|-> <threadgroup indices|-> <name>
    mac <hex>                        HMAC-SHA256 of every byte before this line
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

from etmetal.common.cache import cache_root, file_digest, prepare_root, root_mac

FORMAT = "etmetal-msl-stock/1"
MAX_THREADS_PER_GROUP = 1024  # as mps_kernels: the pipeline's maxTotalThreadsPerThreadgroup


@lru_cache(maxsize=1)
def toolchain_digest() -> str:
    """What decides how a source is built, the source aside: the compiler key of the empty
    source (``msl_compiler.source_key`` hashes the compiler, flags, headers, dispatcher and
    the Python that rewrites the source)."""
    from .msl_compiler import source_key

    return source_key("")


def stock_key(source: str, toolchain: str | None = None) -> str:
    """The record's name: sha256 of the toolchain digest, a newline, the source's bytes."""
    h = hashlib.sha256((toolchain or toolchain_digest()).encode() + b"\n")
    h.update(source.encode())
    return h.hexdigest()


def record_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / "msl" / "stock"


def record_text(library) -> str:
    """The record of a compiled (unchecked) ``MslLibrary``, without its MAC line."""
    lines = [
        FORMAT,
        f"toolchain {toolchain_digest()}",
        f"library {Path(library.path).resolve()}",
        f"sha256 {file_digest(Path(library.path))}",
    ]
    for name, (kernel, i) in sorted(library._kernels.items(), key=lambda kv: kv[1][1]):
        limit = min(MAX_THREADS_PER_GROUP, kernel.max_threads or MAX_THREADS_PER_GROUP)
        loop = int(kernel.path in ("loop", "split"))
        tg = sorted(p.buffer for p in kernel.params if p.buffer is not None and p.threadgroup)
        buffers = ",".join(map(str, kernel.buffer_indices)) or "-"
        lines.append(f"kernel {i} {limit} {loop} {buffers} {','.join(map(str, tg)) or '-'} {name}")
    return "\n".join(lines) + "\n"


def publish(source: str, library) -> Path:
    """Write (atomically) the record of ``library``, built from ``source``; its path."""
    root = prepare_root(cache_root())
    text = record_text(library).encode()
    out = record_dir(root)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = out / f"{stock_key(source)}.txt"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(text + f"mac {root_mac(text, root)}\n".encode())
    os.replace(tmp, path)
    return path
