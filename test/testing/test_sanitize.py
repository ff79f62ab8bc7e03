"""``etmetal regress sanitize``'s harness: native builds are instrumented, the runtimes are
preloaded into an uninstrumented Python, and a planted fault stops the child with the
sanitizer's exit status."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from etmetal.common import native_build
from etmetal.testing.sanitize import sanitized_env

_CHILD = textwrap.dedent(
    """
    import ctypes, sys
    from etmetal.common.native_build import build_shared
    src = '''
    #include <stdlib.h>
    #include <limits.h>
    int overflow_heap(int n, int i) { char* p = (char*)malloc(n); p[i] = 1; int r = p[0]; free(p); return r; }
    int add(int a, int b) { return a + b; }
    '''
    lib = ctypes.CDLL(str(build_shared("sanitize-probe", "libprobe.so", src)))
    print(getattr(lib, sys.argv[1])(*map(int, sys.argv[2:])), flush=True)
    """
)


def _child(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    env = sanitized_env()
    env["ETMETAL_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run(
        [sys.executable, "-c", _CHILD, *argv], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_heap_overflow_in_native_code_stops_the_run_with_asans_report(tmp_path):
    clean = _child(tmp_path, "overflow_heap", "8", "7")  # in bounds
    assert clean.returncode == 0, clean.stderr
    bad = _child(tmp_path, "overflow_heap", "8", "8")
    assert bad.returncode == 86, bad.stderr[-2000:]
    assert "heap-buffer-overflow" in bad.stderr


def test_undefined_behaviour_stops_the_run_with_ubsans_report(tmp_path):
    assert _child(tmp_path, "add", "1", "2").stdout.strip() == "3"
    bad = _child(tmp_path, "add", str(2**31 - 1), "1")  # signed overflow
    assert bad.returncode == 87, bad.stderr[-2000:]
    assert "signed integer overflow" in bad.stderr


def test_builds_are_instrumented_only_when_asked(monkeypatch):
    monkeypatch.delenv(native_build.SANITIZE_ENV, raising=False)
    assert native_build.sanitizer_flags() == ()
    monkeypatch.setenv(native_build.SANITIZE_ENV, "address")
    assert "-fsanitize=address" in native_build.sanitizer_flags()
    monkeypatch.setenv(native_build.SANITIZE_ENV, "address,thread")
    with pytest.raises(native_build.NativeBuildError, match="thread"):
        native_build.sanitizer_flags()


def test_the_sanitized_run_deselects_only_the_rss_flatness_tests():
    """ASan's quarantine keeps freed memory resident: the ``rss_flat`` tests measure that
    allocator, so the sanitized run leaves them out; the normal suite still collects them."""
    from pathlib import Path

    from etmetal.testing.sanitize import pytest_command

    root = Path(__file__).resolve().parents[2]
    target = "test/shims/test_fast_run.py"

    def collected(cmd: list[str]) -> set[str]:
        out = subprocess.run(
            [*cmd, "--collect-only"], cwd=root, capture_output=True, text=True, timeout=300
        ).stdout
        return {line.split("::")[-1] for line in out.splitlines() if "::" in line}

    normal = collected([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", target])
    sanitized = collected(pytest_command([target], workers=1))
    rss = "test_ten_thousand_fast_runs_leave_storages_refcounts_and_rss_flat"
    assert rss in normal and rss not in sanitized
    assert normal - sanitized == {rss}
