"""Private temporary directories for native code the runtime writes out (delegate ``.so``s).

Each directory is made by ``mkdtemp`` (mode 0700, unpredictable suffix) and named
``etmetal-<kind>-<pid>-<random>`` so that a later process can tell whose it was. It is
removed when its owner is released (``weakref.finalize``), on interpreter exit
(``atexit``, through the finalizers), and, if the process was killed before either,
by ``sweep_stale`` in the next etmetal process: a directory whose pid is no longer alive
and that belongs to this user is deleted. Files are created with ``O_EXCL |
O_NOFOLLOW`` so a planted file or symlink is never written through.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
import threading
import weakref
from pathlib import Path

PREFIX = "etmetal-"
_NAME = re.compile(r"^etmetal-[a-z]+-(\d+)-[A-Za-z0-9_]+$")
_swept = False
_lock = threading.Lock()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def sweep_stale(directory: str | os.PathLike | None = None) -> list[Path]:
    """Delete this user's etmetal temp directories whose owning process is gone."""
    root = Path(directory or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        match = _NAME.match(entry.name)
        if not match:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        # only real directories of ours: never follow a symlink, never touch another user's
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _sweep_once() -> None:
    global _swept
    with _lock:
        if _swept:
            return
        _swept = True
    sweep_stale()


_LIVE: set[str] = set()  # directories this process made and has not removed yet


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    _LIVE.discard(path)


@atexit.register
def _remove_all() -> None:
    for path in list(_LIVE):
        _remove(path)


def private_dir(kind: str, owner: object | None = None) -> Path:
    """A new private directory, removed at interpreter exit at the latest, and when
    ``owner`` (if given) is collected; ``track`` attaches an owner later."""
    if not kind.isalpha():
        raise ValueError(f"temp dir kind must be letters only, got {kind!r}")
    _sweep_once()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind.lower()}-{os.getpid()}-"))
    _LIVE.add(str(path))
    if owner is not None:
        track(owner, path)
    return path


def remove(path: str | os.PathLike) -> None:
    """Remove a private directory now."""
    _remove(str(path))


def track(owner: object, path: Path) -> weakref.finalize:
    """Remove ``path`` when ``owner`` is collected (or at exit); call the result to remove now."""
    return weakref.finalize(owner, _remove, str(path))


def write_private_file(directory: Path, name: str, data, mode: int = 0o500) -> Path:
    """Create ``directory/name`` holding ``data``; refuses an existing file or symlink."""
    path = Path(directory) / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path
