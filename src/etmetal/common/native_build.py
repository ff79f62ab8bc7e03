"""Build a shared object from C/C++ sources once, cached by content hash, with the system compiler.

Serves the shim bridge (``shims.native``) and the runtime's native kernels.
Every path returned was verified against the digests recorded when it was built
(:class:`etmetal.common.cache.ContentCache`), so it may be ``dlopen``ed right away. A build is an
entry ``<kind>/<key>`` of :mod:`etmetal.common.cache`, where ``key`` hashes the compiler,
the machine, the flags and every source and header, so any change rebuilds; concurrent
builders wait on the entry's lock and agree on one result.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from .cache import ContentCache

__all__ = [
    "WARNINGS",
    "NativeBuildError",
    "build_files",
    "build_key",
    "build_shared",
    "build_sources",
    "compiler",
    "compiler_version",
    "cpu_identity",
]

_FORMAT = 4  # 4: entries with a verified manifest (etmetal.common.cache)

# every native source of the project builds clean with these (test_native_sources checks)
WARNINGS = ("-Wall", "-Wextra", "-Werror")

# ``ETMETAL_SANITIZE=address,undefined``: every native build of the process is instrumented
# (its own cache entries: the flags are part of the key); ``etmetal regress sanitize`` sets
# it and preloads the runtimes (:mod:`etmetal.testing.sanitize`)
SANITIZE_ENV = "ETMETAL_SANITIZE"
SANITIZERS = ("address", "undefined")


def sanitizer_flags() -> tuple[str, ...]:
    """The compiler flags ``$ETMETAL_SANITIZE`` asks for (none when it is unset)."""
    wanted = [s.strip() for s in os.environ.get(SANITIZE_ENV, "").split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SANITIZERS]
    if unknown:
        raise NativeBuildError(
            f"{SANITIZE_ENV}={os.environ[SANITIZE_ENV]!r}: unknown sanitizer(s) {unknown}; "
            f"choose from {', '.join(SANITIZERS)}"
        )
    if not wanted:
        return ()
    # -fno-sanitize-recover: undefined behaviour stops the process, like an ASan report.
    # The instrumentation changes what g++ 12 can prove about libstdc++'s own code (its
    # <regex> then fails -Werror=maybe-uninitialized), so that one flow warning is off in
    # sanitized builds only; the plain builds keep it.
    return (
        f"-fsanitize={','.join(wanted)}",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
        "-g",
        "-Wno-maybe-uninitialized",
    )


class NativeBuildError(RuntimeError):
    """The system compiler is missing or rejected a source."""


def compiler(lang: str) -> str:
    """The C (``lang="c"``) or C++ (``"c++"``) compiler: $CC/$CXX first, then the usual names."""
    names = ("CC", "gcc", "cc", "clang") if lang == "c" else ("CXX", "g++", "c++", "clang++")
    for cand in (os.environ.get(names[0]), *names[1:]):
        if cand and shutil.which(cand):
            return shutil.which(cand)  # type: ignore[return-value]
    env = names[0]
    raise NativeBuildError(f"no {lang} compiler found (set {env}, or install {names[1]})")


# process-wide memos of facts fixed for the process (the machine, an installed compiler)
@lru_cache(maxsize=1)
def cpu_identity() -> str:
    """What -march=native resolves from: the CPU's model and feature flags (Linux), else the
    machine name. Part of the key of anything built for this CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    keep = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return platform.machine() + "|" + "|".join(dict.fromkeys(keep))


@lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """``cc -v``'s report (version, target, configuration): an artifact only the same
    compiler build may read (a precompiled header) keys on it."""
    proc = subprocess.run([cc, "-v"], capture_output=True, text=True)
    return proc.stderr.strip() or proc.stdout.strip()


def build_key(
    files: Mapping[str, bytes],
    *,
    lang: str = "c",
    flags: Sequence[str] = ("-O2",),
    link: Sequence[str] = (),
    executable: bool = False,
) -> str:
    """The cache entry name of a build: a hash of the compiler, the machine, the flags and
    every file. Predictable on purpose (the entry's manifest, not its name, is what
    :mod:`etmetal.common.cache` trusts)."""
    cc = compiler(lang)
    output = ("#executable",) if executable else ()
    key_text = "|".join(
        [str(_FORMAT), cc, platform.machine(), sys.platform, *flags, "#", *link, *output]
    )
    digest = hashlib.sha256(key_text.encode())
    for name in sorted(files):
        digest.update(f"\n--{name}--\n".encode())
        digest.update(files[name])
    return digest.hexdigest()[:24]


def build_files(
    kind: str,
    lib_name: str,
    files: Mapping[str, bytes],
    compiled: Sequence[str],
    *,
    lang: str = "c",
    flags: Sequence[str] = ("-O2",),
    link: Sequence[str] = (),
    root: Path | None = None,
    executable: bool = False,
) -> Path:
    """Write ``files`` (name -> content) into a fresh entry and compile ``compiled`` of them
    there into one shared object (or, with ``executable``, a program), so ``#include "x.h"``
    finds its neighbours. The key hashes every file, compiled or not."""
    cc = compiler(lang)
    flags = (*flags, *sanitizer_flags())
    key = build_key(files, lang=lang, flags=flags, link=link, executable=executable)
    output = () if executable else ("-shared", "-fPIC")

    def build(tmp: Path) -> None:
        for name, content in files.items():
            (tmp / name).write_bytes(content)
        srcs = [str(tmp / name) for name in compiled]
        cmd = [cc, *flags, *output, "-o", str(tmp / lib_name), *srcs, *link]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise NativeBuildError(f"building {kind} failed ({' '.join(cmd)}):\n{proc.stderr}")

    entry, _ = ContentCache(kind, root).get_or_create(key, build)
    return entry / lib_name


def build_shared(
    kind: str,
    lib_name: str,
    source: str,
    *,
    lang: str = "c",
    flags: Sequence[str] = ("-O2",),
    link: Sequence[str] = (),
    root: Path | None = None,
) -> Path:
    """Compile the text ``source`` into ``<root>/<kind>/<key>/<lib_name>`` unless already built.

    ``root`` defaults to the user cache dir (:func:`etmetal.common.cache.cache_root`).
    ``link`` goes after the source on the command line (libraries, linker options);
    it is part of the key, so a wrapper linking other objects by path is cached per path.
    """
    name = f"{Path(lib_name).stem}.{'c' if lang == 'c' else 'cpp'}"
    files = {name: source.encode()}
    return build_files(kind, lib_name, files, [name], lang=lang, flags=flags, link=link, root=root)


def build_sources(
    kind: str,
    lib_name: str,
    sources: Sequence[Path],
    headers: Sequence[Path] = (),
    *,
    lang: str = "c",
    flags: Sequence[str] = ("-O2",),
    link: Sequence[str] = (),
    root: Path | None = None,
    executable: bool = False,
) -> Path:
    """Compile the source files ``sources`` (with the ``headers`` they include, all by file
    name, so they must not collide) into one shared object, like :func:`build_shared`, or
    into a program with ``executable``."""
    files: dict[str, bytes] = {}
    for path in (*sources, *headers):
        path = Path(path)
        if path.name in files:
            raise NativeBuildError(f"building {kind}: two inputs named {path.name}")
        try:
            files[path.name] = path.read_bytes()
        except OSError as exc:
            raise NativeBuildError(f"building {kind}: cannot read {path}: {exc}") from exc
    compiled = [Path(p).name for p in sources]
    return build_files(
        kind,
        lib_name,
        files,
        compiled,
        lang=lang,
        flags=flags,
        link=link,
        root=root,
        executable=executable,
    )


def load_checked(path: Path, constant: str, expected: int, meaning: str) -> ctypes.CDLL:
    """Load a built library locally and check that its ``int constant(void)`` equals the
    Python side's ``expected`` (a limit both sides must agree on, ``meaning`` names it)."""
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    getter = getattr(lib, constant)
    getter.restype = ctypes.c_int
    if getter() != expected:
        raise NativeBuildError(
            f"{path.name}: {constant}() is {getter()}, the Python side's {meaning} is {expected}"
        )
    return lib
