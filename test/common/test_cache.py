"""The content-addressed cache every build product goes through (AOTI artifacts, native
builds, lowered Cortex-M programs): one root lookup, build once, never half an entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from etmetal.common.cache import COMPLETE, MANIFEST, ContentCache, cache_root


def test_root_is_the_env_var_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ETMETAL_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("ETMETAL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "etmetal"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "etmetal"


def test_an_entry_is_built_once_then_served(tmp_path):
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "out.bin").write_bytes(b"built")

    cache = ContentCache("things", tmp_path)
    entry, hit = cache.get_or_create("k1", build, stamp="k1")
    assert not hit and entry == tmp_path / "things" / "k1"
    assert (entry / "out.bin").read_bytes() == b"built"
    assert (entry / COMPLETE).read_text() == "k1"
    again, hit = cache.get_or_create("k1", build)
    assert hit and again == entry and len(calls) == 1
    # the build ran in a private directory, not in the entry itself
    assert calls[0] != entry and not calls[0].exists()


def test_refresh_builds_again_and_replaces_the_entry(tmp_path):
    cache = ContentCache("things", tmp_path)
    cache.get_or_create("k", lambda t: (t / "v").write_text("old"))
    entry, hit = cache.get_or_create("k", lambda t: (t / "v").write_text("new"), refresh=True)
    assert not hit and (entry / "v").read_text() == "new"


def test_a_failed_build_publishes_nothing(tmp_path):
    cache = ContentCache("things", tmp_path)

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("compiler said no")

    with pytest.raises(RuntimeError, match="compiler said no"):
        cache.get_or_create("k", broken)
    assert cache.lookup("k") is None
    # only the lock file remains: no entry and no leftover temporary directory
    assert [p.name for p in cache.dir.iterdir()] == ["k.lock"]


def test_an_incomplete_directory_is_not_an_entry(tmp_path):
    cache = ContentCache("things", tmp_path)
    (cache.dir / "k").mkdir(parents=True)
    (cache.dir / "k" / "junk").write_text("from a crashed writer of an older format")
    assert cache.lookup("k") is None
    entry, hit = cache.get_or_create("k", lambda t: (t / "v").write_text("ok"))
    assert not hit and sorted(p.name for p in entry.iterdir()) == [COMPLETE, MANIFEST, "v"]


def test_native_builds_are_entries_of_this_cache(tmp_path):
    from etmetal.shims.model_link import build_shared

    lib = build_shared("probe", "libprobe.so", "int probe(void) { return 3; }\n", root=tmp_path)
    entry = lib.parent
    assert entry.parent == tmp_path / "probe"
    assert ContentCache("probe", tmp_path).lookup(entry.name) == entry
    assert (
        build_shared("probe", "libprobe.so", "int probe(void) { return 3; }\n", root=tmp_path)
        == lib
    )


def test_a_failed_key_write_leaks_no_descriptor_and_leaves_no_key(tmp_path, monkeypatch):
    import os

    from etmetal.common import cache as cache_module

    def no_entropy(n: int) -> bytes:
        raise OSError("entropy source unavailable")

    monkeypatch.setattr(cache_module.os, "urandom", no_entropy)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="entropy"):
        cache_module._root_key(tmp_path)
    assert set(os.listdir("/proc/self/fd")) <= before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".key")]
