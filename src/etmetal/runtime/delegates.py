"""The delegate registry: backend id (``BackendDelegate.id``) -> ``BackendExecutor`` class.

Built-in delegates register with ``register_delegate``; other packages plug in through the
``executorch.runtime.delegates`` entry-point group (entry name = backend id, value = a
``BackendExecutor`` subclass). Entry points are read once, on the first lookup, and win
over built-ins of the same id.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from importlib import metadata

from .backend_interface import BackendExecutor

ENTRY_POINT_GROUP = "executorch.runtime.delegates"

_delegates: dict[str, type[BackendExecutor]] = {}
_entry_points_loaded = False
_lock = threading.RLock()


def register_delegate(backend_id: str, executor: type[BackendExecutor] | None = None):
    """Register ``executor`` for ``backend_id``; usable as a class decorator."""

    def decorate(cls: type[BackendExecutor]) -> type[BackendExecutor]:
        if not (isinstance(cls, type) and issubclass(cls, BackendExecutor)):
            raise TypeError(
                f"delegate for {backend_id!r} must subclass BackendExecutor, got {cls!r}"
            )
        with _lock:
            _delegates[backend_id] = cls
        return cls

    return decorate if executor is None else decorate(executor)


def _load_entry_points() -> None:
    global _entry_points_loaded
    with _lock:
        if _entry_points_loaded:
            return
        _entry_points_loaded = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                register_delegate(ep.name, ep.load())
            except Exception as exc:  # one broken plugin must not hide the others
                warnings.warn(
                    f"delegate entry point {ep.name!r} ({ep.value}) failed to load: {exc}",
                    stacklevel=2,
                )


# the delegates etmetal ships: backend id -> (module in this package, class); imported on
# first lookup, and found even if the registry was cleared; registered ids take precedence
_BUILTINS = {"MetalBackend": ("metal_delegate", "MetalDelegate")}


def _builtin(backend_id: str) -> type[BackendExecutor] | None:
    spec = _BUILTINS.get(backend_id)
    if spec is None:
        return None
    return getattr(importlib.import_module(f".{spec[0]}", __package__), spec[1])


def lookup_delegate(backend_id: str) -> type[BackendExecutor] | None:
    _load_entry_points()
    return _delegates.get(backend_id) or _builtin(backend_id)


def registered_delegates() -> list[str]:
    _load_entry_points()
    return sorted(set(_delegates) | set(_BUILTINS))
