"""The content-addressed cache shared by everything etmetal builds once and reuses: AOTI
artifacts, the native shim bridge and kernels, compiled MSL libraries, the Metal
wrapper's precompiled header, lowered Cortex-M programs.

An entry is a directory ``<root>/<kind>/<name>``; ``name`` is chosen by the owner and
carries the content hash of everything that determines the entry (the owner knows what
that is, this module does not). An entry is built in a private temporary directory next to
it, marked complete last and renamed into place, so a reader never sees half an entry and
concurrent builders (serialized by a file lock) agree on one result.

The cache is not trusted blindly: etmetal ``dlopen``s what it finds there.

- The root must belong to the user and be writable by nobody else (as ssh treats a private
  key); :data:`INSECURE_ENV` overrides that, explicitly.
- Every entry carries a manifest (:data:`MANIFEST`): the sha256 of each of its files and a
  MAC over them, the entry's kind and its name, keyed by a secret only the user can read
  (``<root>/.key``, made on first use). A file that no longer matches its digest, a
  manifest that is missing or does not verify (an entry planted or copied under another
  name) make the entry a miss: :meth:`ContentCache.get_or_create` builds it again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

CACHE_DIR_ENV = "ETMETAL_CACHE_DIR"
INSECURE_ENV = "ETMETAL_CACHE_ALLOW_INSECURE"  # "1": accept a shared or foreign cache root
COMPLETE = "complete"  # written last into an entry; its text is the owner's stamp
MANIFEST = "manifest.json"  # digests of the entry's files and their MAC
KEY_FILE = ".key"
_KEY_BYTES = 32
_MANIFEST_FORMAT = 1
# an entry name is one path component: no separator, never "." or ".." (nor hidden: the
# key and the builders' temporary directories start with a dot)
_NAME = re.compile(r"^[^./\\\x00][^/\\\x00]{0,199}$")

log = logging.getLogger(__name__)


class CacheError(RuntimeError):
    """The cache root (or its key) cannot be trusted, or an entry name is not one."""


def cache_root() -> Path:
    """``$ETMETAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/etmetal`` (``~/.cache/etmetal``)."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "etmetal"


def _insecure_allowed() -> bool:
    return os.environ.get(INSECURE_ENV, "") not in ("", "0")


def _refusal(path: Path, why: str) -> CacheError:
    return CacheError(
        f"etmetal refuses the cache directory {path}: {why}. Anyone who can write there can "
        f"plant code that etmetal would load. Use a private directory (chmod 700 {path}, or "
        f"point {CACHE_DIR_ENV} elsewhere), or set {INSECURE_ENV}=1 to use it anyway"
    )


def check_private(path: Path) -> None:
    """Refuse ``path`` unless it is the user's and nobody else may write to it."""
    st = path.stat()
    if _insecure_allowed():
        return
    if not stat.S_ISDIR(st.st_mode):
        raise _refusal(path, "it is not a directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise _refusal(path, f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(st.st_mode)
        raise _refusal(path, f"it is writable by group or others (mode {mode:#o})")


def prepare_root(root: Path) -> Path:
    """Create ``root`` (private) if missing, then check it (:func:`check_private`)."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(root)
    return root


_keys: dict[str, bytes] = {}
# entries this process verified, with the (inode, size, mtime, mode) of each file then: a
# later lookup re-hashes only when one of them changed
_verified: dict[str, tuple] = {}
_keys_lock = threading.Lock()


def _root_key(root: Path) -> bytes:
    """The root's MAC secret, made on first use; readable by the user only."""
    path = root / KEY_FILE
    with _keys_lock:
        cached = _keys.get(str(path))
        if cached is not None:
            return cached
        if not path.exists():
            fd, tmp = tempfile.mkstemp(prefix=".key-", dir=root)  # mode 0600
            try:
                # fdopen closes the descriptor even when the write fails, and writes it all
                with os.fdopen(fd, "wb") as key_file:
                    key_file.write(os.urandom(_KEY_BYTES))
                os.link(tmp, path)  # atomic, never replaces another builder's key
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = os.fstat(fd)
            key = os.read(fd, _KEY_BYTES + 1)
        finally:
            os.close(fd)
        if not _insecure_allowed():
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                raise _refusal(root, f"its key file {path.name} belongs to uid {st.st_uid}")
            if st.st_mode & 0o077:
                raise _refusal(root, f"its key file {path.name} is readable by others")
        if len(key) != _KEY_BYTES:
            raise CacheError(
                f"the cache key file {path} is {len(key)} bytes, not {_KEY_BYTES}: delete it "
                "(every entry is then rebuilt)"
            )
        _keys[str(path)] = key
        return key


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files_of(entry: Path) -> list[str]:
    """The entry's regular files (relative paths), its marker and manifest excluded."""
    out = []
    for dirpath, _dirs, names in os.walk(entry):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), entry)
            if rel not in (COMPLETE, MANIFEST):
                out.append(rel)
    return sorted(out)


def _mac(key: bytes, kind: str, name: str, files: dict[str, str]) -> str:
    text = json.dumps([_MANIFEST_FORMAT, kind, name, sorted(files.items())])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def root_mac(text: bytes, root: str | os.PathLike | None = None) -> str:
    """HMAC-SHA256 of ``text`` under the root's secret (hex): what a native reader of a
    record kept beside the entries (the stock runtime's shader index) checks it with."""
    path = prepare_root(Path(root) if root is not None else cache_root())
    return hmac.new(_root_key(path), text, hashlib.sha256).hexdigest()


class ContentCache:
    """The entries of one ``kind`` under ``root`` (default :func:`cache_root`)."""

    def __init__(self, kind: str, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_root()
        self.kind = kind
        self.dir = self.root / kind

    def entry(self, name: str) -> Path:
        if not isinstance(name, str) or not _NAME.match(name):
            raise CacheError(f"{name!r} is not a cache entry name (one plain path component)")
        return self.dir / name

    def _key(self) -> bytes:
        prepare_root(self.root)
        return _root_key(self.root)

    def _stats(self, entry: Path, files) -> tuple:
        out = []
        for rel in files:
            st = os.lstat(entry / rel)
            out.append((rel, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
        return tuple(out)

    def verify(self, name: str) -> str | None:
        """None if entry ``name`` is complete and every file matches its recorded digest,
        else what is wrong (naming the file)."""
        entry = self.entry(name)
        if not (entry / COMPLETE).exists():
            return f"{entry} is not a complete entry"
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
            files = dict(manifest["files"])
            mac = str(manifest["mac"])
        except (OSError, ValueError, KeyError, TypeError):
            return f"{entry / MANIFEST} is missing or unreadable"
        if not hmac.compare_digest(mac, _mac(self._key(), self.kind, name, files)):
            return f"{entry / MANIFEST} was not written by this user's etmetal for this entry"
        present = _files_of(entry)
        if present != sorted(files):
            extra = sorted(set(present) - set(files)) or sorted(set(files) - set(present))
            return f"{entry / extra[0]} is not what was built there"
        try:
            stats = self._stats(entry, present)
        except OSError as exc:
            return f"{entry}: {exc}"
        if _verified.get(str(entry)) == stats:
            return None
        for rel, st in zip(present, stats):
            if not stat.S_ISREG(st[4]):
                return f"{entry / rel} is not a regular file"
            if file_digest(entry / rel) != files[rel]:
                return f"{entry / rel} does not match the digest recorded when it was built"
        _verified[str(entry)] = stats
        return None

    def lookup(self, name: str) -> Path | None:
        """The entry's directory if it is complete and verifies, else None. Refuses
        (:class:`CacheError`) a root others may write, entry or not."""
        entry = self.entry(name)
        self._key()
        if not (entry / COMPLETE).exists():
            return None
        problem = self.verify(name)
        if problem is not None:
            log.warning("etmetal cache: ignoring %s (%s)", entry, problem)
            return None
        return entry

    def get_or_create(
        self,
        name: str,
        build: Callable[[Path], None],
        *,
        stamp: str = "",
        refresh: bool = False,
    ) -> tuple[Path, bool]:
        """The complete, verified entry ``name`` and whether it was already there.

        ``build(tmp)`` writes the entry's files into the empty directory ``tmp``; it runs
        only on a miss (or always with ``refresh``), under the entry's lock. If it raises,
        nothing is published and the exception propagates. An entry that fails
        verification is a miss: it is built again and replaced.
        """
        entry = self.entry(name)
        key = self._key()
        if not refresh and self.lookup(name) is not None:  # the common case takes no lock
            return entry, True
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with FileLock(str(entry) + ".lock"):
            if not refresh and self.lookup(name) is not None:
                return entry, True
            tmp = Path(tempfile.mkdtemp(prefix=f".{name[:12]}-", dir=self.dir))
            try:
                build(tmp)
                files = {rel: file_digest(tmp / rel) for rel in _files_of(tmp)}
                manifest = {"files": files, "mac": _mac(key, self.kind, name, files)}
                (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
                (tmp / COMPLETE).write_text(stamp)
                if entry.exists() or entry.is_symlink():
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
                os.replace(tmp, entry)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        _verified.pop(str(entry), None)
        return entry, False
