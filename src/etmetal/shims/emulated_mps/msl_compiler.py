"""Compile a Metal shader library's source for this host.

The source is preprocessed by the system C++ compiler with ``msl_compat.h`` force-included
(``#include <c10/metal/...>`` resolves against torch's installed headers, ``<metal_stdlib>``
and friends against empty stand-ins), rewritten into plain C++ (``msl_parse``), given one
``extern "C"`` entry per kernel and built into a shared object linked against the dispatcher
(``msl_dispatch.cpp``). Builds are cached by content (``native.build_files``), and an index
keyed by the source maps it to the built library's entry, so creating a library seen before
skips the preprocessor too. The index holds only the entry's name: it resolves inside the
cache, and the entry (library and kernel descriptions) is verified against its digests
before it is loaded. Includes are limited to Metal's and c10's headers (``msl_includes``).

A checked build (``checked=True``, the device's check mode) is a separate library with its own
key: preprocessed with ``ETM_MSL_CHECK`` and instrumented by ``msl_instrument`` before the
rest of the rewriting. The normal build never contains the checker's accessors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import subprocess
import tempfile
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

from etmetal.common.cache import ContentCache
from etmetal.common.native_build import cpu_identity as _cpu_identity
from etmetal.shims.emulated_mps import msl_split
from etmetal.shims.emulated_mps.msl_classify import library_part, synchronising, tainted_names
from etmetal.shims.emulated_mps.msl_includes import check_markers, check_source
from etmetal.shims.emulated_mps.msl_instrument import Site, instrument
from etmetal.shims.emulated_mps.msl_parse import (
    Kernel,
    Param,
    ParseError,
    entry_source,
    find_kernels,
    float_literals,
    in_library_code,
    line_of,
    rewrite,
    rewrite_address_spaces,
)
from etmetal.shims.model_link import (
    NativeBuildError,
    build_files,
    build_shared,
    cache_root,
    compiler,
)

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
SOURCE_NAME = "library.metal"
_FORMAT = 6  # 2: the index names a verified entry holding kernels.json; 3: + access sites;
# 4: + whether each kernel synchronises (loop entries); 5: + each kernel's path (split entries);
# 6: built for this CPU, split regions without thread-record arrays
KERNELS_FILE = "kernels.json"
_ENTRY_NAME = re.compile(r"^[0-9a-f]{24}$")  # native_build's keys
LIB_NAME = "libmsl.so"
_STD = "-std=c++20"
# -fno-math-errno lets sqrt & co. inline; no -ffast-math: NaN/inf handling must stay IEEE.
_FLAGS = (_STD, "-O2", "-w", "-fno-math-errno", "-fno-strict-aliasing", "-fvisibility=hidden")
# Kernels are built for the CPU they run on (FMA and vector units inline fmaf and vectorize
# the loop entries), with three limits so that results stay those of the portable build:
# no contraction of a*b+c into one rounding (Metal's precise results are what c10 computes;
# the portable build never contracts), and no native half arithmetic (AVX512-FP16 rounds each
# half operation where the portable build keeps excess float precision). The CPU is part of
# the cache key (``_cpu_identity``): a library built here never runs on another CPU model.
_ARCH_FLAGS = ("-march=native", "-mno-avx512fp16", "-ffp-contract=off")
# Metal's standard headers: everything they declare comes from msl_compat.h.
_STUB_HEADERS = (
    "metal_stdlib", "metal_compute", "metal_atomic", "metal_array", "metal_math",
    "metal_simdgroup", "metal_integer", "metal_relational", "metal_common", "metal_geometric",
    "metal_numeric", "metal_types", "metal_type_traits", "metal_limits", "metal_pack",
    "metal_matrix", "metal_simdgroup_matrix", "metal_utility", "metal_stdint",
)  # fmt: skip


class CompileError(Exception):
    """The library does not compile; ``kernel`` and ``construct`` say where and what."""

    def __init__(self, kernel: str, construct: str, detail: str) -> None:
        super().__init__(detail)
        self.kernel = kernel
        self.construct = construct
        self.detail = detail


def _header_text() -> str:
    return "".join(p.read_text() for p in sorted(HERE.glob("*.h")))


# process-wide memos of facts fixed for the process (torch's install, a built file):
# no context's state
@lru_cache(maxsize=1)
def torch_include_dir() -> str | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    inc = Path(next(iter(spec.submodule_search_locations))) / "include"
    return str(inc) if inc.is_dir() else None


# The dispatcher is one unit: the fiber executor, then the checker and the pool, which use its
# worker and threadgroup records.
DISPATCHER_PARTS = ("msl_dispatch.cpp", "msl_check.cpp", "msl_pool.cpp")


def dispatcher_source() -> str:
    """The dispatcher's translation unit, as it is built (msl_abi.h pasted in)."""
    src = "".join((HERE / name).read_text() for name in DISPATCHER_PARTS)
    return src.replace('#include "msl_abi.h"', (HERE / "msl_abi.h").read_text())


@lru_cache(maxsize=1)
def dispatcher_path() -> Path:
    """The dispatcher's shared object (built once per content)."""
    src = dispatcher_source()
    return build_shared(
        "msl-dispatch",
        "libetmetal_msl_dispatch.so",
        src,
        lang="c++",
        flags=("-std=c++17", "-O2", "-fno-exceptions"),
    )


@lru_cache(maxsize=1)
def build_flags() -> tuple[str, ...]:
    """The kernel build's flags: ``_FLAGS`` plus the CPU's own instruction set where this
    compiler accepts it (probed once per process), else the portable build."""
    arch = ("-ffp-contract=off",)
    if os.environ.get(PORTABLE_ENV, "") in ("", "0"):
        probe = subprocess.run(
            [compiler("c++"), *_ARCH_FLAGS, "-x", "c++", "-fsyntax-only", "-"],
            input="int main() { return 0; }\n",
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            arch = _ARCH_FLAGS
    return (*_FLAGS, *arch)


PORTABLE_ENV = "ETMETAL_MSL_PORTABLE"  # set to 1: build kernels for any CPU of this architecture


def _write_stubs(d: Path) -> None:
    """Metal's standard headers as empty files, in the preprocessing's own private directory
    (never in the shared cache, where anyone who could write them would inject code)."""
    d.mkdir()
    for name in _STUB_HEADERS:
        (d / name).write_text("// stand-in: etmetal's msl_compat.h declares this\n")


def _preprocess(source: str, checked: bool = False) -> str:
    check_source(source, frozenset(_STUB_HEADERS))
    with tempfile.TemporaryDirectory(prefix="etmetal-msl-") as tmp:
        path = Path(tmp) / SOURCE_NAME
        path.write_text(source)
        stubs = Path(tmp) / "include"
        _write_stubs(stubs)
        cmd = [compiler("c++"), "-E", "-x", "c++", _STD, "-include", str(HERE / "msl_compat.h")]
        cmd += ["-I", str(HERE), "-I", str(stubs)]
        if checked:
            cmd.append("-DETM_MSL_CHECK=1")
        if torch_include_dir():
            cmd += ["-I", torch_include_dir()]
        proc = subprocess.run(cmd + [SOURCE_NAME], capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise _diagnose(_own_lines(proc.stderr, [tmp, str(HERE)]), "", [])
        c10 = os.path.join(torch_include_dir(), "c10", "metal") if torch_include_dir() else ""
        check_markers(proc.stdout, SOURCE_NAME, [str(stubs), c10, str(HERE)])
    return proc.stdout


def _own_lines(stderr: str, own: list[str]) -> str:
    """The compiler's messages without any line located in a file outside ``own`` (the
    library, etmetal's headers): a message must never quote a foreign file."""
    keep = []
    for ln in stderr.splitlines():
        m = re.match(r"^([^:\n]+):\d+:", ln)
        if m and m.group(1) != SOURCE_NAME and not m.group(1).startswith(tuple(own)):
            ln = "error: (a message located outside the library and etmetal's headers)"
        elif not m and ln.startswith(" "):
            continue  # a quoted source line under a message
        keep.append(ln)
    return "\n".join(keep)


def _locations(stderr: str) -> list[tuple[str, int]]:
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"^([^:\n]+):(\d+):", stderr, re.M)]


_CONSTRUCT_PATTERNS = (
    r"'([^']+)' was not declared in this scope",
    r"'([^']+)' is not a member of '([^']+)'",
    r"has no member named '([^']+)'",
    r"'([^']+)' does not name a type",
    r"'([^']+)' has not been declared",
    r"no matching function for call to '([^'(]+)",
    r"no match for '([^']+)'",
    r"'([^']+)' is not a template",
    r"fatal error: ([^:]+): No such file",
    r"unknown type name '([^']+)'",
    r"use of undeclared identifier '([^']+)'",
)


def _construct(message: str) -> str:
    for pat in _CONSTRUCT_PATTERNS:
        m = re.search(pat, message)
        if m:
            if m.lastindex and m.lastindex >= 2 and "is not a member of" in pat:
                return f"{m.group(2)}::{m.group(1)}"
            return m.group(1)
    return message.strip()


def _diagnose(stderr: str, text: str, kernels: list[Kernel]) -> CompileError:
    """The first error, the construct it names and the kernel it is in (or is required by)."""
    stderr = stderr.replace("\u2018", "'").replace("\u2019", "'")  # g++ quotes in UTF-8 locales
    err = next((ln for ln in stderr.splitlines() if " error: " in ln or "fatal error" in ln), "")
    if not err:
        err = stderr.strip().splitlines()[-1] if stderr.strip() else "compiler failed"
    message = err.split("error: ", 1)[-1]
    construct = _construct(message)
    spans = [(k, line_of(text, k.start), line_of(text, k.end)) for k in kernels]
    kernel = None
    # the error line first, then the lines of "required from here" instantiation notes
    for file, line in _locations(stderr):
        if file == "<etmetal kernel entries>" and 2 <= line <= len(kernels) + 1:
            kernel = kernels[line - 2].name
            break
        for k, (f0, l0), (_, l1) in spans:
            if file.endswith(f0) and f0 and l0 <= line <= l1:
                kernel = k.name
                break
        if kernel:
            break
    if kernel is None:
        kernel = ", ".join(k.name for k in kernels) if kernels else "<library>"
    return CompileError(kernel, construct, err.strip())


def _index_path(key: str) -> Path:
    return cache_root() / "msl" / "index" / f"{key}.json"


def source_key(source: str, checked: bool = False, split: bool = True) -> str:
    parts = [
        str(_FORMAT),
        compiler("c++"),
        *build_flags(),
        _cpu_identity(),
        str(torch_include_dir()),
    ]
    text = "|".join(parts + (["checked"] if checked else []) + ([] if split else ["nosplit"]))
    h = hashlib.sha256(text.encode())
    h.update(_header_text().encode())
    # a library links the dispatcher by path: one built against another dispatcher build
    # (another cache format, say) would load a second copy with its own fiber state
    h.update(str(dispatcher_path()).encode())
    shaping = (
        "msl_dispatch.cpp", "msl_parse.py", "msl_compiler.py", "msl_instrument.py", "msl_classify.py",
        "msl_split.py", "msl_split_emit.py",
    )  # fmt: skip
    for name in shaping:  # what shapes the build
        h.update((HERE / name).read_bytes())
    h.update(b"\0" + source.encode())
    return h.hexdigest()[:32]


def _from_index(key: str) -> tuple[Path, list[Kernel], list[Site]] | None:
    """The library the index records for source ``key``, if it resolves to a verified entry
    of the cache built for that same source; else None (then it is built again)."""
    index = _index_path(key)
    try:
        name = json.loads(index.read_text())["entry"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("etmetal: ignoring the MSL index entry %s (%s)", index, exc)
        return None
    if not isinstance(name, str) or not _ENTRY_NAME.match(name):
        log.warning("etmetal: ignoring the MSL index entry %s (not an entry name)", index)
        return None
    entry = ContentCache("msl").lookup(name)  # a plain name: resolves inside the cache
    if entry is None:
        return None
    try:
        described = json.loads((entry / KERNELS_FILE).read_text())
        if described.get("source_key") != key:
            return None
        kernels = [_kernel_from_json(k) for k in described["kernels"]]
        return entry / LIB_NAME, kernels, [Site(**x) for x in described["sites"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_library(
    source: str, checked: bool = False, split: bool = True
) -> tuple[Path, list[Kernel], list[Site]]:
    """Compile ``source`` (cached) and describe its kernels and, for a checked build, its
    checked access sites. ``split=False`` keeps every synchronising kernel on fibers (the
    reference the split path is tested against). Raises CompileError/ParseError."""
    key = source_key(source, checked, split)
    index = _index_path(key)
    found = _from_index(key)
    if found is not None:
        return found
    text, sites = _preprocess(source, checked), []
    if checked:
        text, sites = instrument(text, str(HERE))
    text = in_library_code(rewrite_address_spaces(text), float_literals, str(HERE))
    kernels = find_kernels(text)
    for k, syncs in zip(
        kernels, synchronising(text, [(k.start, k.end) for k in kernels], str(HERE))
    ):
        k.sync = syncs
        k.path = "fibers" if syncs else "loop"
        if checked:
            k.path, k.path_reason = "fibers", "a checked build follows each thread on fibers"
        elif syncs and not split:
            k.path_reason = "splitting turned off"
    names = [k.name for k in kernels]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ParseError(sorted(dup)[0], "two kernels share this name")
    plain = rewrite(text) + entry_source(kernels, loops=not checked)
    unit = plain
    if split and not checked and any(k.sync for k in kernels):
        tainted = tainted_names(library_part(text, str(HERE)))
        unit = rewrite(msl_split.apply(text, kernels, tainted))
        unit += entry_source(kernels, loops=True)
    described = {"source_key": key, "sites": [asdict(x) for x in sites]}
    try:
        so = _build(unit, described, kernels)
    except NativeBuildError as e:
        if unit is plain:
            raise _diagnose(str(e), text, kernels) from None
        # the split code did not compile: the kernels it was for run on fibers
        if os.environ.get(PATHS_ENV, "") not in ("", "0"):
            first = next((ln for ln in str(e).splitlines() if "error" in ln), str(e)[:300])
            log.warning("etmetal: the split code did not compile: %s", first)
        for k in kernels:
            if k.path == "split":
                k.path, k.path_reason = "fibers", "its split code did not compile"
                k.batch = False
        try:
            so = _build(rewrite(text) + entry_source(kernels, loops=True), described, kernels)
        except NativeBuildError as e2:
            raise _diagnose(str(e2), text, kernels) from None
    index.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = index.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"entry": so.parent.name}))
    os.replace(tmp, index)
    return so, kernels, sites


def _build(unit: str, described: dict, kernels: list[Kernel]) -> Path:
    dispatcher = dispatcher_path()
    # libm: the header's __builtin_expf & co. become calls to expf & co. when not folded
    link = ["-Wl,--no-as-needed", str(dispatcher), f"-Wl,-rpath,{dispatcher.parent}", "-lm"]
    # the kernels' description travels in the entry, under its digests
    described = {**described, "kernels": [asdict(k) for k in kernels]}
    files = {"library.cpp": unit.encode(), KERNELS_FILE: json.dumps(described).encode()}
    return build_files(
        "msl",
        LIB_NAME,
        files,
        ["library.cpp"],
        lang="c++",
        flags=(*build_flags(), "-fpreprocessed"),
        link=link,
    )


PATHS_ENV = "ETMETAL_MSL_PATHS"  # set to 1: log how each kernel of a library runs, and why


def log_paths(kernels: list[Kernel]) -> None:
    if os.environ.get(PATHS_ENV, "") not in ("", "0"):
        for k in kernels:
            reason = f" ({k.path_reason})" if k.path_reason else ""
            log.warning("etmetal: MSL kernel '%s' runs as %s%s", k.name, k.path, reason)


def _kernel_from_json(d: dict) -> Kernel:
    params = [Param(**p) for p in d.pop("params")]
    return Kernel(params=params, **d)
