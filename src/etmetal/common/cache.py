"""The content-addressed cache shared by everything etmetal builds once and reuses: AOTI
artifacts, the native shim bridge and kernels, lowered Cortex-M programs.

An entry is a directory ``<root>/<kind>/<name>``; ``name`` is chosen by the owner and
carries the content hash of everything that determines the entry (the owner knows what
that is, this module does not). An entry is built in a private temporary directory next to
it, marked complete last and renamed into place, so a reader never sees half an entry and
concurrent builders (serialized by a file lock) agree on one result.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

CACHE_DIR_ENV = "ETMETAL_CACHE_DIR"
COMPLETE = "complete"  # written last into an entry; its text is the owner's stamp


def cache_root() -> Path:
    """``$ETMETAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/etmetal`` (``~/.cache/etmetal``)."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "etmetal"


class ContentCache:
    """The entries of one ``kind`` under ``root`` (default :func:`cache_root`)."""

    def __init__(self, kind: str, root: str | os.PathLike | None = None):
        self.dir = (Path(root) if root is not None else cache_root()) / kind

    def entry(self, name: str) -> Path:
        return self.dir / name

    def lookup(self, name: str) -> Path | None:
        """The entry's directory if it is complete, else None."""
        entry = self.entry(name)
        return entry if (entry / COMPLETE).exists() else None

    def get_or_create(
        self,
        name: str,
        build: Callable[[Path], None],
        *,
        stamp: str = "",
        refresh: bool = False,
    ) -> tuple[Path, bool]:
        """The complete entry ``name`` and whether it was already there.

        ``build(tmp)`` writes the entry's files into the empty directory ``tmp``; it runs
        only on a miss (or always with ``refresh``), under the entry's lock. If it raises,
        nothing is published and the exception propagates.
        """
        entry = self.entry(name)
        if not refresh and self.lookup(name) is not None:  # the common case takes no lock
            return entry, True
        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(entry) + ".lock"):
            if not refresh and self.lookup(name) is not None:
                return entry, True
            tmp = Path(tempfile.mkdtemp(prefix=f".{name[:12]}-", dir=self.dir))
            try:
                build(tmp)
                (tmp / COMPLETE).write_text(stamp)
                if entry.exists():
                    shutil.rmtree(entry)
                os.replace(tmp, entry)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return entry, False
