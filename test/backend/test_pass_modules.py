"""Graph passes have one shape (exir's): a ``*Pass`` ``PassBase`` class whose
``call(graph_module)`` returns a ``PassResult``, one per ``*_pass.py`` module, in
``backend/passes/`` and ``layout/``; helpers live outside ``passes/``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from torch.fx.passes.infra.pass_base import PassBase

import etmetal

ROOT = Path(etmetal.__file__).resolve().parent
PASS_FOLDERS = ("backend/passes", "layout")


def _modules(folder: str) -> list[str]:
    package = "etmetal." + folder.replace("/", ".")
    return [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / folder)])]


def _own_pass_classes(module) -> list[type]:
    return [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, PassBase) and c.__module__ == module.__name__
    ]


@pytest.mark.parametrize("folder", PASS_FOLDERS)
def test_each_pass_module_defines_one_pass_class(folder):
    pass_modules = [m for m in _modules(folder) if m.endswith("_pass")]
    assert pass_modules, f"{folder} has no *_pass.py module"
    for name in pass_modules:
        classes = _own_pass_classes(importlib.import_module(name))
        assert len(classes) == 1, f"{name}: PassBase classes {classes}"
        [cls] = classes
        assert cls.__name__.endswith("Pass"), f"{name}: {cls.__name__} is not named *Pass"
        assert "call" in vars(cls), f"{cls.__name__} does not define call()"
        assert list(inspect.signature(cls.call).parameters) == ["self", "graph_module"]


@pytest.mark.parametrize("folder", PASS_FOLDERS)
def test_no_pass_class_outside_a_pass_module(folder):
    for name in _modules(folder):
        if not name.endswith("_pass"):
            found = _own_pass_classes(importlib.import_module(name))
            assert found == [], f"{name} defines passes {found} but is not a *_pass.py module"


def test_passes_folder_holds_only_passes():
    names = [m.rpartition(".")[2] for m in _modules("backend/passes")]
    assert names and all(n.endswith("_pass") for n in names), names
