"""Keep the CLI's output to its own progress and results.

Importing torch, torchao and ExecuTorch, and lowering with them, prints messages a user
cannot act on: torchao's "Failed to load ..._C_mxfp8" and "no triton" log lines, torch's
pytree log lines (one even at ``etmetal bench --help``, when torchao registers an enum), and
a ``FutureWarning`` each time ExecuTorch copies a tree spec. Unless
``-v`` is given, the CLI drops the log records of those packages below ERROR and every
Python warning raised from inside their code. A warning raised by etmetal's own code, or
by a user's module the CLI imports, is still shown.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import sysconfig
import warnings

QUIET_PACKAGES = ("torch", "torchao", "executorch")
# frames that only relay a warning (the warning machinery, deprecation wrappers, copy)
_RELAYS = ("warnings", "typing_extensions")


def _package_dirs() -> tuple[str, ...]:
    dirs = []
    for name in QUIET_PACKAGES:
        spec = importlib.util.find_spec(name)  # finds without importing
        dirs += list(spec.submodule_search_locations or []) if spec else []
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _raised_inside(package_dirs: tuple[str, ...]) -> bool:
    """Whether the innermost frame that is neither a relay nor the standard library, on the
    stack of the warning being shown, belongs to one of ``package_dirs``."""
    stdlib = os.path.join(os.path.realpath(sysconfig.get_paths()["stdlib"]), "")
    frame = sys._getframe(2)  # skip this function and the showwarning hook
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        path = os.path.realpath(frame.f_code.co_filename)
        relay = module.split(".")[0] in _RELAYS or module == __name__
        in_stdlib = path.startswith(stdlib) and "site-packages" not in path
        if not (relay or in_stdlib):
            return path.startswith(package_dirs)
        frame = frame.f_back
    return False


def silence_dependencies() -> None:
    """Drop the dependencies' own warnings and log lines for the rest of this process."""
    show = warnings.showwarning
    if getattr(show, "etmetal_quiet", False):  # main() called again in one process
        quiet_loggers()
        return
    package_dirs = _package_dirs()

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not _raised_inside(package_dirs):
            show(message, category, filename, lineno, file, line)

    showwarning.etmetal_quiet = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning
    # importing torch sets its loggers' levels (WARNING) whatever they were before, so the
    # levels are lowered after it: the commands' own imports (torchao logs through torch's
    # pytree logger while it loads) then find them quiet
    import torch  # noqa: F401

    quiet_loggers()


def quiet_loggers() -> None:
    """Raise the dependencies' loggers to ERROR, including any that set their own level
    (torch's logging setup gives its registered loggers explicit levels on import)."""
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in QUIET_PACKAGES]
    for name in (*QUIET_PACKAGES, *names):
        logger = logging.getLogger(name)
        if logger.level < logging.ERROR:
            logger.setLevel(logging.ERROR)
