"""ExecuTorch's program schema and ``.pte``/``.ptd`` parsers, without ``executorch.exir``'s init.

The runtime needs ``executorch.exir.schema`` (the Program dataclasses) and the parsers in
``executorch.exir._serialize`` and ``executorch.extension.flat_tensor.serialize``. None of
them needs the export stack, but importing any ``executorch.exir.*`` module first runs
``executorch/exir/__init__.py``, which imports ``torch._dynamo`` and ``torch._inductor``
(about 4 s, most of the cost of ``import etmetal.runtime``).

So, when ``executorch.exir`` has not been imported yet, this module imports those submodules
from their own files under their own names while a bare stand-in for the package (its
spec, not its code) sits in ``sys.modules``; then it takes the stand-in out again. The
submodules stay in ``sys.modules``, so a later ``import executorch.exir`` (by the user or
the ahead-of-time code) reuses them: one copy of every schema class, and ``isinstance``
holds across the runtime and ``exir``. A small finder binds them as attributes of their
package when that package is really imported (``executorch.exir.schema`` then works as an
attribute too), and the package's init runs in full at that point.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

_PACKAGE = "executorch.exir"
# what the runtime uses; their own imports come along (schema, _serialize, tensor, ...)
_LIGHT = (
    "executorch.exir.schema",
    "executorch.exir._serialize._program",
    "executorch.exir._serialize._cord",
    "executorch.extension.flat_tensor.serialize.serialize",
)


class _BindChildren(importlib.abc.Loader):
    """Wraps a package's loader: binds the already-imported children, then runs its init.

    ``loader`` is None for a namespace package (nothing to run)."""

    def __init__(self, loader: Any, children: dict[str, ModuleType]) -> None:
        self._loader = loader
        self._children = children

    def __getattr__(self, name: str) -> Any:  # the rest of the loader protocol, unchanged
        if self._loader is None:
            raise AttributeError(name)
        return getattr(self._loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        for attr, child in self._children.items():
            setattr(module, attr, child)
        if self._loader is not None:
            self._loader.exec_module(module)


class _ParentFinder(importlib.abc.MetaPathFinder):
    """Finds the packages left unimported, so their children become attributes on import."""

    def __init__(self, parents: Iterable[str]) -> None:
        self._waiting = set(parents)

    def find_spec(self, name: str, path: Any = None, target: Any = None):
        if name not in self._waiting:
            return None
        self._waiting.discard(name)  # stays in sys.meta_path: removing it mid-search skips a finder
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        prefix = name + "."
        children = {
            key[len(prefix) :]: mod
            for key, mod in list(sys.modules.items())
            if key.startswith(prefix) and "." not in key[len(prefix) :]
        }
        spec.loader = _BindChildren(spec.loader, children)
        return spec


def _import_without_package_init() -> None:
    spec = importlib.util.find_spec(_PACKAGE)  # imports ``executorch`` (a namespace) only
    if spec is None:
        raise ImportError(f"{_PACKAGE} is not installed; etmetal's runtime reads its schema")
    before = set(sys.modules)
    sys.modules[_PACKAGE] = importlib.util.module_from_spec(spec)
    try:
        for name in _LIGHT:
            importlib.import_module(name)
    except BaseException:
        # leave nothing half-imported: a later ``import executorch.exir`` starts clean
        for name in set(sys.modules) - before:
            if name.startswith("executorch."):
                del sys.modules[name]
        raise
    finally:
        sys.modules.pop(_PACKAGE, None)
    # Namespace packages (``executorch.exir.backend``) compute their path from the
    # stand-in; they go too and are imported for real when needed.
    added = [n for n in set(sys.modules) - before if n.startswith(_PACKAGE + ".")]
    gone = {_PACKAGE}
    for name in added:
        path = getattr(sys.modules[name], "__path__", None)
        if path is not None and not isinstance(path, list):
            del sys.modules[name]
            gone.add(name)
    sys.meta_path.insert(0, _ParentFinder(gone))


if _PACKAGE not in sys.modules:
    _import_without_package_init()

# by full name: ``from executorch.exir import schema`` would import the package itself
schema = importlib.import_module("executorch.exir.schema")
pte_parser = importlib.import_module("executorch.exir._serialize._program")
ptd_parser = importlib.import_module("executorch.extension.flat_tensor.serialize.serialize")
Cord = importlib.import_module("executorch.exir._serialize._cord").Cord

__all__ = ["Cord", "pte_parser", "ptd_parser", "schema"]
