"""The folder layout is the architecture: these checks keep it so."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import etmetal

ROOT = Path(__file__).resolve().parents[1]
TEST = ROOT / "test"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative ones resolved to etmetal.*)."""
    package = "etmetal." + ".".join(path.relative_to(ROOT).parent.parts)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_version_comes_from_the_package_metadata():
    init = (ROOT / "src/etmetal/__init__.py").read_text()
    assert re.search(r"__version__ = \"\d+\.\d", init) is None, "a second, literal version"
    if sys.version_info >= (3, 11):
        import tomllib

        declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
        assert etmetal.__version__ == declared


def test_lower_is_importable_from_the_package():
    from etmetal.backend.lowering import lower

    assert etmetal.lower is lower


def test_common_imports_nothing_of_the_project():
    for path in (ROOT / "common").glob("*.py"):
        own = {
            n
            for n in _imports(path)
            if n.startswith("etmetal") and not n.startswith("etmetal.common")
        }
        assert not own, f"{path.name} imports {sorted(own)}"


def test_shims_import_only_common_of_the_project():
    for path in (ROOT / "shims").glob("*.py"):
        own = {
            n
            for n in _imports(path)
            if n.startswith("etmetal") and not n.startswith(("etmetal.shims", "etmetal.common"))
        }
        assert not own, f"src/etmetal/shims/{path.name} imports {sorted(own)}"


def test_only_cli_tests_import_scripts():
    """Library code lives outside src/etmetal/scripts/: other tests reach etmetal.scripts only by
    running the CLI (``etmetal.scripts.cli`` or ``python -m etmetal.scripts``)."""
    offenders = []
    for path in TEST.rglob("*.py"):
        if path.parent == TEST / "scripts" or path.name == "test_cli.py":
            continue
        bad = {
            n
            for n in _imports(path)
            if n.startswith("etmetal.scripts") and not n.startswith("etmetal.scripts.cli")
        }
        if bad:
            offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert offenders == []


def test_scripts_stay_under_2500_lines():
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "scripts").glob("*.py"))
    assert lines < 2500, (
        f"src/etmetal/scripts/*.py has {lines} lines: library code belongs elsewhere"
    )
