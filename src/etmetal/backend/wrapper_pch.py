"""A precompiled header for the ``mps_emulated`` wrapper build: torch's headers, parsed once.

Every Metal wrapper Inductor generates starts with the same ``#include`` lines (torch's AOTI
runtime and Metal shim headers, a few standard ones); parsing them is about a seventh of
the wrapper's g++ time (the rest is code generation, which no header cache saves). The
prelude is those leading lines, taken from the wrapper itself, so a wrapper that includes
something else gets its own header. It is built once per content into the cache
(:mod:`etmetal.common.cache`, kind ``pch``) under the entry's file lock, so concurrent
builders (pytest-xdist workers) share one, and force-included (``-include``) into the
wrapper's compile, where g++ reads the ``.gch`` beside it.

g++ uses a ``.gch`` whose flags differ from the compile's without a word under ``-w``, and
such a mismatch can even crash it (a header built at ``-O1`` read at ``-O2``); an unusable
``.gch`` is otherwise skipped and the header's text parsed instead, so the result stays
the same. The entry's name therefore hashes everything the ``.gch`` depends on: the exact
flags, the compiler's own report (``cc -v``), this CPU, the prelude and the digest of its
preprocessed text (a changed torch header changes it). A ``.gch`` that no longer matches
the digest recorded when it was built makes the entry a miss, and it is built again.
Objects built with and without the header are byte-identical
(``test/backend/mps_emulated/test_wrapper_pch.py``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from etmetal.common.cache import ContentCache
from etmetal.common.native_build import compiler_version, cpu_identity

log = logging.getLogger(__name__)

PCH_ENV = "ETMETAL_WRAPPER_PCH"  # "0": build every wrapper without the precompiled header
KIND = "pch"
HEADER = "wrapper_prelude.h"
_FORMAT = 1  # bump when the entry's layout or the recipe below changes
# one ``#include <...>`` / ``#include "..."`` line
INCLUDE_LINE = re.compile(r"^\s*#\s*include\s*[<\"][^>\"]+[>\"]\s*$")


def enabled() -> bool:
    return os.environ.get(PCH_ENV, "1") not in ("0", "")


def leading_includes(source: str) -> str:
    """The ``#include`` lines a source starts with (blank lines between them skipped), as
    the prelude's text; empty if it starts with anything else."""
    lines = []
    for line in source.splitlines():
        if not line.strip():
            continue
        if not INCLUDE_LINE.match(line):
            break
        lines.append(line.strip())
    return "\n".join(lines) + "\n" if lines else ""


@lru_cache(maxsize=16)
def _preprocessed_digest(cxx: str, flags: tuple[str, ...], prelude: str) -> str:
    """sha256 of the prelude as the compiler preprocesses it with ``flags``, without line
    markers (they name the temporary directory); memoized per process: the installed
    headers do not change under a running process."""
    with tempfile.TemporaryDirectory(prefix="etmetal-pch-") as tmp:
        header = Path(tmp) / HEADER
        header.write_text(prelude)
        proc = subprocess.run(
            [cxx, *flags, "-E", "-P", "-x", "c++-header", str(header)], capture_output=True
        )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.decode(errors="replace")[-2000:])
    return hashlib.sha256(proc.stdout).hexdigest()


def entry_name(cxx: str, flags: Sequence[str], prelude: str) -> str:
    """The cache entry of the header built by ``cxx`` with ``flags`` for ``prelude``."""
    flags = tuple(flags)
    h = hashlib.sha256()
    for part in (str(_FORMAT), cxx, compiler_version(cxx), cpu_identity(), *flags, prelude):
        h.update(part.encode() + b"\0")
    h.update(_preprocessed_digest(cxx, flags, prelude).encode())
    return h.hexdigest()[:32]


def _build(cxx: str, flags: tuple[str, ...], prelude: str, out: Path) -> None:
    header = out / HEADER
    header.write_text(prelude)
    cmd = [cxx, *flags, "-x", "c++-header", str(header), "-o", str(header) + ".gch"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")


def prelude_header(cpp: Path, cxx: str, flags: Sequence[str]) -> Path | None:
    """The precompiled prelude of wrapper ``cpp`` for a compile with ``flags`` (the header
    to ``-include``; its ``.gch`` sits beside it), built on first use; None when turned off
    (:data:`PCH_ENV`), when the wrapper starts with no ``#include`` or when it cannot be
    built (the wrapper then builds without it, as before)."""
    if not enabled():
        return None
    prelude = leading_includes(cpp.read_text())
    if not prelude:
        return None
    flags = tuple(flags)
    try:
        name = entry_name(cxx, flags, prelude)
        entry, _ = ContentCache(KIND).get_or_create(
            name, lambda out: _build(cxx, flags, prelude, out), stamp=f"pch {_FORMAT}"
        )
    except (OSError, RuntimeError) as exc:
        # a missing header or a full disk: the compile itself reports what is wrong
        log.warning("etmetal: building the wrapper without a precompiled header (%s)", exc)
        return None
    return entry / HEADER
