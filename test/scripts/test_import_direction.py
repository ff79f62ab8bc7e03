"""Imports run one way: ``etmetal.scripts`` (the CLI) may import the library, and no library
module imports ``etmetal.scripts``, at the top or inside a function, by statement or by
``importlib.import_module``. Measuring code therefore lives in ``etmetal.bench``."""

from __future__ import annotations

import ast
from pathlib import Path

import etmetal

PACKAGE = Path(etmetal.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module name ``source`` (the module ``module``) imports, wherever the import is."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func, first = node.func, node.args[0]
            called = getattr(func, "attr", getattr(func, "id", ""))
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if called in ("import_module", "__import__") and literal:
                names.add(first.value)
    return names


def _reaches_scripts(names: set[str]) -> set[str]:
    return {n for n in names if n == "etmetal.scripts" or n.startswith("etmetal.scripts.")}


def test_the_check_sees_every_form_of_import():
    source = (
        "import importlib\n"
        "from etmetal import bench\n"
        "def f():\n"
        "    from ..scripts.bench_delegate import torch_runner\n"
        "    importlib.import_module('etmetal.scripts.cli')\n"
        "    from etmetal import scripts\n"
    )
    found = _reaches_scripts(imported_names(source, "etmetal.bench.llm"))
    assert found == {
        "etmetal.scripts.bench_delegate",
        "etmetal.scripts.bench_delegate.torch_runner",
        "etmetal.scripts.cli",
        "etmetal.scripts",
    }
    assert _reaches_scripts(imported_names("from . import timing\n", "etmetal.bench.llm")) == set()


def test_no_library_module_imports_scripts():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "scripts") in path.parents:
            continue
        names = imported_names(path.read_text(), _module_name(path), path.name == "__init__.py")
        bad = _reaches_scripts(names)
        if bad:
            offenders.append(f"{path.relative_to(PACKAGE.parent)}: {sorted(bad)}")
    assert offenders == []
