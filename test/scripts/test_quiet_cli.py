"""The CLI shows its own progress and results, not the dependencies' warnings and logs."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

from etmetal.examples.demo import DEMO_MODELS
from etmetal.scripts import quiet
from etmetal.scripts.cli import COMMANDS

# a Python warning ("...Warning: ..."), torch's glog-style log lines ("W1130 12:00:00...")
# and torchao's library-load complaints
WARNING_LINE = re.compile(r"(^|[\s:])\w*Warning: |^[WE]\d{4} \d\d:|Failed to load")


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``etmetal ARGS`` in a fresh interpreter, with no PYTHONWARNINGS of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARNINGS")}
    cmd = [sys.executable, "-m", "etmetal.scripts", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def test_demo_prints_no_warning_line(tmp_path):
    # one demo model and one view_copy case: every stage of the demo (export, lowering
    # with the partitioner, AOTI from the shared cache, etmetal's runtime, the stock runtime)
    proc = _cli(
        *("demo", "--runs", "2", "--model", "patch_embedding", "--case", "patch_embed"),
        *("--out-dir", str(tmp_path)),
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    warning_lines = [line for line in output.splitlines() if WARNING_LINE.search(line)]
    assert warning_lines == []
    # its own progress and results are still there
    assert "== patch_embedding" in proc.stdout
    assert re.search(r"patch_embedding\s+OK", proc.stdout)
    assert "etmetal: 4/4 exact" in proc.stdout


# ``bench --help`` imports every benchmark suite, torchao with them: torchao's import logs
# through torch's pytree logger, whose level torch's own import had reset
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_prints_no_warning_line(command):
    args = ["--help"] if command is None else [command, "--help"]
    proc = _cli(*args)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert [line for line in output.splitlines() if WARNING_LINE.search(line)] == []
    assert proc.stdout.startswith("usage: etmetal")  # the help itself is still printed
    assert proc.stderr == ""


def test_demo_on_the_emulated_metal_target_runs_every_model_quietly(tmp_path):
    # every demo model lowered with Inductor's real Metal code, run on the emulated device
    proc = _cli(
        *("demo", "--target", "mps_emulated", "--runs", "2", "--no-view-copy"),
        *("--out-dir", str(tmp_path)),
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert [line for line in output.splitlines() if WARNING_LINE.search(line)] == []
    for model in DEMO_MODELS:
        assert f"== {model.name}" in proc.stdout
        assert re.search(rf"{model.name}\s+OK", proc.stdout)  # matched eager
    assert proc.stdout.count("lowered for target mps_emulated") == len(DEMO_MODELS)
    assert proc.stdout.count("(target mps_emulated): 1 delegate") == len(DEMO_MODELS)


def _warn_from(filename: str):
    """A function whose code lives at ``filename``, which warns when called."""
    namespace: dict = {"warnings": warnings}
    code = compile(
        "def f():\n    warnings.warn('from there', UserWarning, stacklevel=1)\n", filename, "exec"
    )
    exec(code, namespace)
    return namespace["f"]


def test_warnings_raised_inside_torch_are_dropped_and_others_kept():
    inside_torch = _warn_from(os.path.join(os.path.dirname(torch.__file__), "fake_module.py"))
    levels = {n: logging.getLogger(n).level for n in quiet.QUIET_PACKAGES}
    try:
        with warnings.catch_warnings():  # restores showwarning and the filters afterwards
            warnings.simplefilter("always")
            shown: list[str] = []
            warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
            quiet.silence_dependencies()
            inside_torch()
            assert shown == []
            warnings.warn("from etmetal's side", UserWarning, stacklevel=1)
            assert shown == ["from etmetal's side"]
            # a dependency's log record below ERROR is dropped, an error still shows
            assert not logging.getLogger("torchao.kernel").isEnabledFor(logging.WARNING)
            assert logging.getLogger("torchao.kernel").isEnabledFor(logging.ERROR)
            assert logging.getLogger("etmetal.backend").getEffectiveLevel() < logging.ERROR
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
