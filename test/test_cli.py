import subprocess
import sys

import pytest


def _etmetal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", *args], capture_output=True, text=True
    )


def test_help_lists_every_command():
    from etmetal.scripts.cli import COMMANDS

    out = _etmetal("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout


def test_doctor_reports_versions_and_targets():
    out = _etmetal("doctor")
    assert out.returncode == 0, out.stderr
    import torch

    assert torch.__version__ in out.stdout
    assert "target host" in out.stdout and "compile + run" in out.stdout
    assert "target mps" in out.stdout


def test_unknown_command_is_an_error_naming_it():
    out = _etmetal("frobnicate")
    assert out.returncode != 0
    assert "frobnicate" in out.stderr


@pytest.mark.parametrize("module", ["etmetal.shims", "etmetal.runtime", "etmetal.backends"])
def test_subpackages_import(module):
    __import__(module)
