"""The folder layout is the architecture: these checks keep it so (docs/architecture.md cites them).

Imports are read from the source with ``ast`` wherever they sit (module level, inside a
function, under ``TYPE_CHECKING``), relative ones resolved, ``from etmetal import X`` mapped to
the module that defines ``X`` and ``importlib.import_module("...")`` with a literal name
counted too, over every ``.py`` file of each folder, subfolders included.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import etmetal

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "etmetal"
TEST = ROOT / "test"

# the two sides of a program file; what they must agree on lives in common/
AHEAD_OF_TIME = ("backend", "layout")
RUN_TIME = ("runtime", "shims", "stock_runtime")


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str | None = None) -> set[str]:
    """Every module ``path`` imports, as absolute dotted names (``module``: the file's own
    dotted name, for relative imports; by default read from its place in the package)."""
    inside = module is not None or PACKAGE in path.resolve().parents
    if module is None and inside:
        module = _module_of(path)
    package = module if path.name == "__init__.py" else (module or "").rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert inside, f"{path}: relative import outside the package"
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    # etmetal's lazy top-level names: ``from etmetal import lower`` imports its module
    names.update(etmetal._LAZY[n.split(".")[1]] for n in set(names) if _is_lazy_name(n))
    return names


def _is_lazy_name(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 2 and parts[0] == "etmetal" and parts[1] in etmetal._LAZY


def _project_imports(path: Path) -> set[str]:
    """The etmetal subpackages ``path`` imports (``etmetal.shims``, ``etmetal.common``...)."""
    out = set()
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "etmetal" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
            out.add(f"etmetal.{parts[1]}")
    return out


def _sources(*folders: str) -> list[Path]:
    paths = sorted(p for f in folders for p in (PACKAGE / f).rglob("*.py"))
    assert paths, f"no Python files under {folders}"
    return paths


def _offenders(folders: tuple[str, ...], forbidden: set[str]) -> list[str]:
    out = []
    for path in _sources(*folders):
        bad = _project_imports(path) & forbidden
        if bad:
            out.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    return out


# -- the reader itself: each rule below is only as good as what it sees --------------------
def test_the_import_reader_sees_function_level_relative_and_lazy_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n"
        "    from ..method import Method\n"
        "    from ... import lower\n"
        "    import etmetal.shims.handles\n"
        "    importlib.import_module('etmetal.layout.config')\n"
    )
    names = _imports(probe, module="etmetal.runtime.kernels.probe")
    assert "etmetal.runtime.method" in names
    assert "etmetal.backend.lowering" in names  # etmetal.lower, resolved to its module
    assert "etmetal.shims.handles" in names
    assert "etmetal.layout.config" in names


def test_every_folder_the_rules_name_exists():
    for folder in (*AHEAD_OF_TIME, *RUN_TIME, "common", "scripts", "shims/emulated_mps"):
        assert (PACKAGE / folder / "__init__.py").is_file(), folder


# -- the rules docs/architecture.md states ------------------------------------------------
def test_ahead_of_time_code_never_imports_the_runtime_side():
    assert _offenders(AHEAD_OF_TIME, {f"etmetal.{f}" for f in RUN_TIME}) == []


def test_runtime_code_never_imports_the_ahead_of_time_side():
    assert _offenders(RUN_TIME, {f"etmetal.{f}" for f in AHEAD_OF_TIME}) == []


def test_common_imports_nothing_of_the_project_but_common():
    everything = {f"etmetal.{p.name}" for p in PACKAGE.iterdir() if p.is_dir()}
    assert _offenders(("common",), everything - {"etmetal.common"}) == []


def test_shims_import_only_shims_and_common():
    """shims/ (with shims/emulated_mps/) is the ABI a .so calls: it stands on common/ alone."""
    everything = {f"etmetal.{p.name}" for p in PACKAGE.iterdir() if p.is_dir()}
    assert _offenders(("shims",), everything - {"etmetal.shims", "etmetal.common"}) == []


def test_no_library_code_imports_scripts():
    """scripts/ parses arguments, calls the library and prints; the library never calls back."""
    library = [p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "scripts"]
    library = [f for f in library if f != "__pycache__"]
    assert _offenders(tuple(library), {"etmetal.scripts"}) == []
    assert "etmetal.scripts" not in _project_imports(PACKAGE / "__init__.py")


def _doc_import_table() -> dict[str, set[str] | None]:
    """folder -> the subpackages the architecture doc's Parts table lets it import
    (None: anything)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table: dict[str, set[str] | None] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        folder = re.fullmatch(r"`(\w+)/`", cells[0]) if len(cells) == 3 else None
        if folder:
            allowed = cells[2]
            names = set(re.findall(r"`(\w+)/`", allowed))
            table[folder.group(1)] = None if allowed == "anything" else names
    return table


def test_the_import_table_of_the_architecture_doc_holds():
    table = _doc_import_table()
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert set(table) == folders, "docs/architecture.md's Parts table lists other folders"
    broken = []
    for folder, allowed in table.items():
        if allowed is None:
            continue
        for path in _sources(folder):
            bad = {m for m in _project_imports(path) if m.split(".")[1] not in {folder, *allowed}}
            if bad:
                broken.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert broken == []


def test_importing_the_runtime_loads_nothing_ahead_of_time():
    import subprocess

    code = (
        "import sys, etmetal.runtime, etmetal.shims\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
        f"{[['etmetal', f] for f in AHEAD_OF_TIME]!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_only_cli_tests_import_scripts():
    """Other tests reach etmetal.scripts only by running the CLI (``etmetal.scripts.cli`` or
    ``python -m etmetal.scripts``)."""
    offenders = []
    for path in TEST.rglob("*.py"):
        if TEST / "scripts" in path.parents or path.name == "test_cli.py":
            continue
        bad = {
            n
            for n in _imports(path)
            if n.startswith("etmetal.scripts") and not n.startswith("etmetal.scripts.cli")
        }
        if bad:
            offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert offenders == []


def test_no_symlinks_in_the_repository():
    """Every file has one path: the package folders are real folders under src/etmetal/."""
    links = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "dist")]
        links += [
            os.path.join(top, n) for n in dirs + files if os.path.islink(os.path.join(top, n))
        ]
    assert links == []


def test_every_package_folder_is_a_package():
    """A folder of Python files without ``__init__.py`` would not ship in a normal install."""
    missing = [
        str(d.relative_to(ROOT))
        for d in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").is_file()
    ]
    assert missing == []


def test_version_comes_from_the_package_metadata():
    init = (PACKAGE / "__init__.py").read_text()
    assert re.search(r"__version__ = \"\d+\.\d", init) is None, "a second, literal version"
    if sys.version_info >= (3, 11):
        import tomllib

        declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
        assert etmetal.__version__ == declared


def test_lower_is_importable_from_the_package():
    from etmetal.backend.lowering import lower

    assert etmetal.lower is lower
