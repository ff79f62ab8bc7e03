"""Private temp directories: 0700, owner-pid names, O_NOFOLLOW writes, cleanup, stale sweep."""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys

import pytest

from etmetal.runtime import tempfiles


class Owner:
    pass


def test_private_dir_is_0700_named_by_pid_and_removed_with_its_owner():
    owner = Owner()
    path = tempfiles.private_dir("delegate", owner)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert path.name.startswith(f"etmetal-delegate-{os.getpid()}-")
    written = tempfiles.write_private_file(path, "model.so", b"\x7fELF")
    assert written.read_bytes() == b"\x7fELF"
    del owner
    gc.collect()
    assert not path.exists()


def test_writes_never_follow_a_planted_symlink_or_file(tmp_path):
    owner = Owner()
    directory = tempfiles.private_dir("delegate", owner)
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    (directory / "model.so").symlink_to(target)
    with pytest.raises(OSError):
        tempfiles.write_private_file(directory, "model.so", b"evil")
    assert target.read_bytes() == b"keep"
    (directory / "other.so").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        tempfiles.write_private_file(directory, "other.so", b"evil")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_dirs_of_dead_processes_only(tmp_path):
    dead = tmp_path / f"etmetal-delegate-{_dead_pid()}-abc123"
    (dead / "sub").mkdir(parents=True)
    (dead / "delegate.so").write_bytes(b"x")
    alive = tmp_path / f"etmetal-delegate-{os.getppid()}-def456"
    alive.mkdir()
    mine = tmp_path / f"etmetal-delegate-{os.getpid()}-ghi789"
    mine.mkdir()
    unrelated = tmp_path / "etmetal-suite-xyz"
    unrelated.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep")
    link = tmp_path / f"etmetal-delegate-{_dead_pid()}-lnk000"
    link.symlink_to(outside)

    removed = tempfiles.sweep_stale(tmp_path)

    assert removed == [dead]
    assert not dead.exists()
    assert alive.exists() and mine.exists() and unrelated.exists()
    assert link.is_symlink() and (outside / "precious").read_bytes() == b"keep"


def test_interpreter_exit_and_exceptions_clean_up(tmp_path):
    code = (
        "import sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
        "from etmetal.runtime import tempfiles\n"
        "class O: pass\n"
        "keep = O()\n"
        "tempfiles.private_dir('delegate', keep)\n"  # owner alive at exit
        "tempfiles.private_dir('scratch')\n"  # no owner: atexit
        "raise SystemExit(3)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env)
    assert proc.returncode == 3
    assert list(tmp_path.iterdir()) == []
