"""No import circle in the etmetal package.

The graph counts every import: module level, inside functions and under
``TYPE_CHECKING``, because a circle a function import closes still ties the
modules together (a newcomer cannot read or move one without the other).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import etmetal

PACKAGE_ROOT = Path(etmetal.__file__).resolve().parent


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under ``root``."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join([package, *parts])] = path
    return names


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    # A package's own __init__ is its base for level 1; a plain module's base is its parent.
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = (
                    _resolve_relative(name, is_package, node.level, node.module)
                    if node.level
                    else node.module or ""
                )
                for alias in node.names:
                    # `from pkg import name` imports the module pkg.name when it is one.
                    candidate = f"{source}.{alias.name}"
                    targets.append(candidate if candidate in modules else source)
            for target in targets:
                # `import a.b.c` runs a, a.b and a.b.c; the leaf is the edge that matters,
                # and a parent package is counted only if the leaf is not a module.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def _package_edges(graph: dict[str, set[str]], module: str) -> set[str]:
    return graph[module]


def test_etmetal_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE_ROOT, "etmetal")
    assert len(graph) > 100, "the walk found too few modules; is PACKAGE_ROOT right?"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_cycle_closed_inside_a_function_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/sub/__init__.py": "",
            "pkg/b.py": "from .sub import c\n",
            "pkg/sub/c.py": "def f():\n    from ..a import thing\n",
        },
    )
    cycle = find_cycle(import_graph(tmp_path / "pkg", "pkg"))
    assert cycle == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]


def test_type_checking_import_counts(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from pkg.a import A
            """,
        },
    )
    assert find_cycle(import_graph(tmp_path / "pkg", "pkg")) == ["pkg.a", "pkg.b", "pkg.a"]


def test_acyclic_package_passes(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import a\n",
            "pkg/a.py": "from pkg.b import name\nimport os\n",
            "pkg/b.py": "name = 1\n",
        },
    )
    graph = import_graph(tmp_path / "pkg", "pkg")
    assert graph["pkg"] == {"pkg.a"}
    assert graph["pkg.a"] == {"pkg.b"}
    assert find_cycle(graph) is None
