"""The build cache is not trusted blindly (issue 24): a root others may write is refused, and
an entry whose files, manifest or name do not verify is built again, never loaded. The
acceptance cases plant a ``.so`` whose constructor writes a marker file and load from the
cache in a fresh process: the marker must never appear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from etmetal.common.cache import (
    INSECURE_ENV,
    MANIFEST,
    CacheError,
    ContentCache,
)
from etmetal.common.native_build import build_key, build_shared, compiler

SRC = "int probe(void) { return 41; }\n"


def _build(tmp: Path) -> None:
    (tmp / "out.bin").write_bytes(b"built")


def _counting():
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "out.bin").write_bytes(b"built")

    return calls, build


def _private(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


def test_a_group_or_world_writable_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(INSECURE_ENV, raising=False)
    root = _private(tmp_path / "shared")
    os.chmod(root, 0o777)
    with pytest.raises(CacheError, match=r"writable by group or others \(mode 0o777\)") as e:
        ContentCache("things", root).get_or_create("k", _build)
    assert str(root) in str(e.value) and INSECURE_ENV in str(e.value)
    assert not (root / "things").exists()  # nothing was written before the refusal
    os.chmod(root, 0o720)
    with pytest.raises(CacheError, match="group or others"):
        ContentCache("things", root).lookup("k")


def test_the_override_allows_a_shared_root(tmp_path, monkeypatch):
    root = _private(tmp_path / "shared")
    os.chmod(root, 0o777)
    monkeypatch.setenv(INSECURE_ENV, "1")
    entry, hit = ContentCache("things", root).get_or_create("k", _build)
    assert not hit and (entry / "out.bin").read_bytes() == b"built"


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs chown")
def test_a_root_owned_by_someone_else_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(INSECURE_ENV, raising=False)
    root = _private(tmp_path / "theirs")
    os.chown(root, 12345, 12345)
    with pytest.raises(CacheError, match="belongs to uid 12345"):
        ContentCache("things", root).get_or_create("k", _build)


def test_a_missing_root_is_created_private(tmp_path):
    root = tmp_path / "new" / "cache"
    ContentCache("things", root).get_or_create("k", _build)
    assert (root.stat().st_mode & 0o777) == 0o700
    assert (root / ".key").stat().st_mode & 0o077 == 0


def test_a_changed_file_is_rebuilt(tmp_path):
    cache = ContentCache("things", tmp_path)
    calls, build = _counting()
    entry, _ = cache.get_or_create("k", build)
    (entry / "out.bin").write_bytes(b"planted")
    assert cache.verify("k") is not None and "out.bin" in cache.verify("k")
    assert cache.lookup("k") is None
    again, hit = cache.get_or_create("k", build)
    assert not hit and len(calls) == 2 and (again / "out.bin").read_bytes() == b"built"


def test_an_added_file_is_rebuilt(tmp_path):
    cache = ContentCache("things", tmp_path)
    entry, _ = cache.get_or_create("k", _build)
    (entry / "extra.so").write_bytes(b"\x7fELF")
    assert "extra.so" in cache.verify("k")
    _, hit = cache.get_or_create("k", _build)
    assert not hit and not (cache.entry("k") / "extra.so").exists()


def test_a_planted_entry_with_a_forged_manifest_is_rebuilt(tmp_path):
    cache = ContentCache("things", tmp_path)
    cache.get_or_create("other", _build)  # the root and its key exist
    planted = cache.dir / "k"
    planted.mkdir()
    (planted / "out.bin").write_bytes(b"planted")
    import hashlib

    digest = hashlib.sha256(b"planted").hexdigest()
    (planted / MANIFEST).write_text(json.dumps({"files": {"out.bin": digest}, "mac": "0" * 64}))
    (planted / "complete").write_text("")
    assert "not written by this user's etmetal" in cache.verify("k")
    entry, hit = cache.get_or_create("k", _build)
    assert not hit and (entry / "out.bin").read_bytes() == b"built"


def test_an_entry_copied_under_another_name_does_not_verify(tmp_path):
    import shutil

    cache = ContentCache("things", tmp_path)
    entry, _ = cache.get_or_create("a", _build)
    shutil.copytree(entry, cache.dir / "b")
    assert cache.lookup("b") is None
    assert ContentCache("other-kind", tmp_path).dir != cache.dir


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "..", "/abs"])
def test_entry_names_are_one_plain_component(tmp_path, name):
    with pytest.raises(CacheError, match="not a cache entry name"):
        ContentCache("things", tmp_path).lookup(name)


# --- acceptance: planted code never runs, in a fresh process ------------------------------

PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
  FILE* f = fopen("@MARKER@", "w");
  if (f) { fputs("ran", f); fclose(f); }
}
int probe(void) { return 666; }
"""


def _planted_so(tmp_path: Path, marker: Path) -> Path:
    src = tmp_path / "planted.c"
    src.write_text(PLANTED.replace("@MARKER@", str(marker)))
    so = tmp_path / "planted.so"
    subprocess.run([compiler("c"), "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


def _fresh(code: str, root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ETMETAL_CACHE_DIR": str(root)}
    env.pop(INSECURE_ENV, None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


LOAD_PROBE = """
    import ctypes
    from etmetal.common.native_build import build_shared
    lib = ctypes.CDLL(str(build_shared("probe", "libprobe.so", {src!r})))
    print(lib.probe())
"""


def test_a_so_planted_at_a_predicted_key_never_runs(tmp_path):
    root = _private(tmp_path / "cache")
    marker = tmp_path / "marker"
    planted = _planted_so(tmp_path, marker)
    # the attacker predicts the entry name and plants a whole entry there, marker included
    files = {"libprobe.c": SRC.encode()}
    entry = root / "probe" / build_key(files, lang="c", flags=("-O2",))
    entry.mkdir(parents=True)
    (entry / "libprobe.so").write_bytes(planted.read_bytes())
    (entry / "libprobe.c").write_text(SRC)
    (entry / "complete").write_text("")
    proc = _fresh(LOAD_PROBE.format(src=SRC), root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["41"]  # etmetal's own build, not the planted one
    assert not marker.exists()


def test_a_so_replaced_inside_a_built_entry_never_runs(tmp_path):
    root = _private(tmp_path / "cache")
    marker = tmp_path / "marker"
    lib = build_shared("probe", "libprobe.so", SRC, root=root)
    lib.write_bytes(_planted_so(tmp_path, marker).read_bytes())
    proc = _fresh(LOAD_PROBE.format(src=SRC), root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["41"]
    assert not marker.exists()


KERNEL = """
#include <metal_stdlib>
kernel void twice(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  out[i] = 2.0f * float(i);
}
"""

RUN_KERNEL = """
    import ctypes, torch
    from etmetal.shims.emulated_mps import compile_library
    fn = compile_library({src!r}).function("twice")
    out = torch.zeros(4)
    fn.dispatch({{0: out.data_ptr()}}, threads=(4,))
    print(out.tolist())
"""


@pytest.mark.parametrize("where", ["outside", "traversal", "absolute"])
def test_an_msl_index_entry_pointing_outside_the_cache_is_never_loaded(
    tmp_path, where, monkeypatch
):
    from etmetal.shims.emulated_mps import msl_compiler

    root = _private(tmp_path / "cache")
    marker = tmp_path / "marker"
    planted = _planted_so(tmp_path, marker)
    monkeypatch.setenv("ETMETAL_CACHE_DIR", str(root))
    msl_compiler.dispatcher_path.cache_clear()  # the attacker's prediction, in this root
    try:
        index = msl_compiler._index_path(msl_compiler.source_key(KERNEL))
    finally:
        msl_compiler.dispatcher_path.cache_clear()
    index.parent.mkdir(parents=True, exist_ok=True)
    kernels = [{"name": "twice", "call": "twice", "params": [], "start": 0, "end": 0}]
    entry = {
        "outside": str(planted.parent),
        "traversal": os.path.relpath(planted.parent, root / "msl"),
        "absolute": str(planted),
    }[where]
    # the old format (a path to the .so) and the new one (an entry name), both hostile
    index.write_text(json.dumps({"so": str(planted), "entry": entry, "kernels": kernels}))
    proc = _fresh(RUN_KERNEL.format(src=KERNEL), root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[0.0, 2.0, 4.0, 6.0]"
    assert not marker.exists()


def test_an_msl_library_replaced_in_its_entry_never_runs(tmp_path):
    root = _private(tmp_path / "cache")
    marker = tmp_path / "marker"
    first = _fresh(RUN_KERNEL.format(src=KERNEL), root)
    assert first.returncode == 0, first.stderr
    (lib,) = [p for p in (root / "msl").glob("*/libmsl.so")]
    lib.write_bytes(_planted_so(tmp_path, marker).read_bytes())
    proc = _fresh(RUN_KERNEL.format(src=KERNEL), root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[0.0, 2.0, 4.0, 6.0]"
    assert not marker.exists()
