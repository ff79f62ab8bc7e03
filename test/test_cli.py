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


@pytest.mark.parametrize("module", ["etmetal.shims", "etmetal.runtime", "etmetal.backend"])
def test_subpackages_import(module):
    __import__(module)


def test_doctor_reports_the_emulated_metal_target_from_both_sides():
    import json
    import shutil

    from etmetal.runtime import metal_delegate

    facts = json.loads(_etmetal("doctor", "--json").stdout)
    line = facts["target mps_emulated"]
    compile_part, run_part = line.split("; run: ")
    has_cxx = shutil.which("g++") is not None or shutil.which("c++") is not None
    assert compile_part.startswith("compile: yes" if has_cxx else "compile: no")
    # "run" is the runtime's answer: its Metal delegate runs the target or it does not
    runs = "mps_emulated" in getattr(metal_delegate, "TARGET_DEVICES", {})
    assert run_part.startswith("yes" if runs else "no")


def test_doctor_says_no_compile_without_a_compiler():
    import json
    import os

    env = {**os.environ, "CXX": "no-such-compiler-etmetal"}
    out = subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    line = json.loads(out.stdout)["target mps_emulated"]
    assert line.startswith("compile: no (no C++ compiler")


def test_demo_on_mps_emulated_fails_clearly_where_it_cannot_run(monkeypatch, capsys):
    import argparse

    from etmetal.scripts import demo, doctor

    monkeypatch.setattr(doctor, "mps_emulated_run", lambda: (False, "no emulated device here"))
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    code = demo.run(parser.parse_args(["--target", "mps_emulated", "--no-view-copy"]))
    assert code == 2
    assert "cannot run it: no emulated device here" in capsys.readouterr().out
