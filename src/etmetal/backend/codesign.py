"""Code signing of a compiled ``.so`` for macOS (Hardened Runtime refuses unsigned code).

Only meaningful on macOS, where ``codesign`` exists; elsewhere a requested identity
is reported and ignored, since the ``.so`` is signed when lowering on a Mac.
"""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)


def codesign(so_path: Path, identity: str | None) -> bool:
    """Sign ``so_path`` in place with ``identity`` (``-`` = ad hoc). True if it signed."""
    if not identity:
        return False
    if platform.system() != "Darwin":
        log.warning(
            "codesign_identity %r ignored: code signing needs macOS (this is %s)",
            identity,
            platform.system(),
        )
        return False
    tool = shutil.which("codesign")
    if tool is None:
        raise RuntimeError("codesign_identity was given but the codesign tool is not on PATH")
    done = subprocess.run(
        [tool, "--force", "--sign", identity, str(so_path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"codesign --sign {identity!r} {so_path} failed ({done.returncode}): {done.stderr.strip()}"
        )
    return True
