"""A normal and an editable install each import every subpackage, from where they were installed.

The package lives under ``src/etmetal`` as real folders; a wheel must carry every module and
every native source and header beside it (the runtime compiles them at first use), and an
editable install must resolve to the checkout. Each install goes into a fresh virtual
environment that sees this interpreter's site-packages for torch and ExecuTorch only.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# imports every module of the installed package and reports where it came from
PROBE = r"""
import importlib, json, pkgutil, sys
import etmetal
failed = {}
names = []
for info in pkgutil.walk_packages(etmetal.__path__, "etmetal."):
    if info.name.endswith("__main__"):
        continue
    names.append(info.name)
    try:
        importlib.import_module(info.name)
    except BaseException as exc:
        failed[info.name] = repr(exc)[:300]
print(json.dumps({"file": etmetal.__file__, "modules": names, "failed": failed}))
"""


def _tracked_sources() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "src/etmetal"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {p[len("src/") :] for p in out}


def _install_and_probe(tmp_path: Path, editable: bool) -> dict:
    env_dir = tmp_path / ("editable" if editable else "normal")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # the venv's own interpreter runs pip (this environment's pip module, seen through the
    # system site-packages), so pip installs into the venv and never touches, let alone
    # uninstalls, this environment's etmetal; no network: no deps, no build isolation
    args = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    args += ["-e", str(ROOT)] if editable else [str(ROOT)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"pip install failed:\n{proc.stderr[-3000:]}"
    probe = subprocess.run(
        [str(python), "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("editable", [False, True], ids=["normal", "editable"])
def test_an_install_imports_every_subpackage(tmp_path: Path, editable: bool):
    report = _install_and_probe(tmp_path, editable)
    where = Path(report["file"]).resolve()
    if editable:
        assert where == (ROOT / "src" / "etmetal" / "__init__.py").resolve()
    else:
        assert tmp_path in where.parents, f"etmetal imported from {where}, not the new install"
        # every tracked file of the package (native sources and headers too) was installed
        installed = {
            str(p.relative_to(where.parent.parent))
            for p in where.parent.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        assert _tracked_sources() - installed == set()
    assert report["failed"] == {}
    packages = {m for m in report["modules"] if m.count(".") == 1}
    expected = {
        f"etmetal.{p.name}"
        for p in (ROOT / "src" / "etmetal").iterdir()
        if (p / "__init__.py").exists()
    }
    assert expected <= packages
