"""Run tests with etmetal's native layer built under AddressSanitizer and UBSan.

``etmetal regress sanitize`` runs pytest in a child process with ``$ETMETAL_SANITIZE`` set,
so every native build of that process (the shim bridge with ``native_tensors.cpp`` and
``native_fallbacks.cpp``, the emulated device's executor and kernels, the runtime's native
kernels, the stock-runtime backend) is compiled with ``-fsanitize=...`` into cache entries
of its own. The instrumented objects are loaded into an uninstrumented Python, so the
sanitizer runtimes are preloaded (``LD_PRELOAD``), leak checking is off (the interpreter
keeps its memory until exit) and the first report stops the process: a test run that
finishes is a clean run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from etmetal.common.native_build import SANITIZE_ENV, SANITIZERS, NativeBuildError, compiler

# what issue 25 asks to run instrumented: the shims (native and Python), the delegate end to
# end, and the fuzz campaign's hostile inputs
DEFAULT_TESTS = ("test/shims", "test/delegate", "test/hardening/test_fuzz_campaign.py")
# tests marked rss_flat assert that resident memory stays flat over thousands of runs:
# under ASan, freed memory sits in the allocator's quarantine (and every allocation carries
# redzones), so RSS grows whatever the shims do. They measure the allocator, not the shims,
# and are deselected here only; the normal suite runs them. Tests marked deliberate_ub run a
# kernel that indexes past its own array on purpose, for the Metal checker to report: the
# kernel's code is instrumented too, and UBSan stops at that access before the checker can
DESELECT = "not rss_flat and not deliberate_ub"
# the runtime each sanitizer's instrumented code calls into
_RUNTIMES = {"address": "libasan.so", "undefined": "libubsan.so"}


def runtime_libraries(sanitizers: Sequence[str]) -> list[str]:
    """The sanitizer runtimes of the system C++ compiler, in preload order (ASan first)."""
    cxx = compiler("c++")
    paths = []
    for name in sanitizers:
        if name not in _RUNTIMES:
            raise NativeBuildError(f"unknown sanitizer {name!r}; choose from {SANITIZERS}")
        out = subprocess.run(
            [cxx, f"-print-file-name={_RUNTIMES[name]}"], capture_output=True, text=True
        ).stdout.strip()
        if not out or not Path(out).is_file():
            raise NativeBuildError(
                f"{cxx} has no {_RUNTIMES[name]} (install the compiler's sanitizer runtimes)"
            )
        paths.append(str(Path(out).resolve()))
    return paths


def sanitized_env(sanitizers: Sequence[str] = SANITIZERS) -> dict[str, str]:
    """The environment of a child process whose native builds are instrumented."""
    env = dict(os.environ)
    env[SANITIZE_ENV] = ",".join(sanitizers)
    preload = [*runtime_libraries(sanitizers), *filter(None, [env.get("LD_PRELOAD")])]
    env["LD_PRELOAD"] = " ".join(preload)
    # halt at the first report; leaks are Python's, not a finding. An allocation too big to
    # serve returns NULL, as malloc does without ASan (ASan's default aborts): a hostile
    # size must reach the allocator's failure path the shims turn into an error code
    env["ASAN_OPTIONS"] = (
        "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86:allocator_may_return_null=1"
    )
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=87"
    return env


def pytest_command(
    tests: Sequence[str] = DEFAULT_TESTS, *, workers: int = 2, extra: Sequence[str] = ()
) -> list[str]:
    """The pytest command line of a sanitized run: ``tests`` with the ``rss_flat`` and
    ``deliberate_ub`` tests deselected (:data:`DESELECT`)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", DESELECT]
    if workers > 1:
        cmd += ["-n", str(workers)]
    return [*cmd, *tests, *extra]


def run_tests(
    tests: Sequence[str] = DEFAULT_TESTS,
    *,
    sanitizers: Sequence[str] = SANITIZERS,
    workers: int = 2,
    extra: Sequence[str] = (),
    cwd: Path | None = None,
) -> int:
    """:func:`pytest_command` with the native layer instrumented; its exit status (86: an
    AddressSanitizer report, 87: UBSan's)."""
    cmd = pytest_command(tests, workers=workers, extra=extra)
    return subprocess.run(cmd, env=sanitized_env(sanitizers), cwd=cwd).returncode
