"""The closed kernel table against hostile programs: a ``.pte`` whose operator table names
an operator with file side effects (``aten::from_file``) or any operator outside the table
is refused when its method loads, with an etmetal error naming the operator, and no file
is created: through the Python API, through ``etmetal run``, and in isolate mode.

The programs are ``x + 1`` edited with exir's own serializer
(:mod:`etmetal.testing.hostile_programs`); run by a runtime that resolves any
``torch.ops`` name, ``from_file_program`` creates its file (checked below with torch
itself, so the test cannot pass for the wrong reason).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from etmetal.runtime import MissingKernelError, Runtime
from etmetal.runtime.kernels import allow_torch_operator, registry
from etmetal.testing import hostile_programs as hostile


def _assert_refusal_names(message: str, op: str) -> None:
    assert op in message
    assert "register_kernel" in message and "executorch.runtime.kernels" in message


def test_the_hostile_program_would_create_its_file_if_its_operator_ran(tmp_path):
    # the reference: torch's own from_file with the program's arguments creates the file
    path = tmp_path / "made_by_torch"
    torch.from_file(str(path), shared=True, size=4)
    assert path.stat().st_size == 16


@pytest.mark.parametrize("isolate", [False, True])
def test_from_file_is_refused_at_load_and_no_file_is_created(tmp_path, isolate):
    target = tmp_path / "planted"
    program = Runtime.get().load_program(hostile.from_file_program(str(target)), isolate=isolate)
    with pytest.raises(MissingKernelError) as info:
        program.load_method("forward")
    assert info.value.operators == ["aten::from_file"]
    _assert_refusal_names(str(info.value), "aten::from_file")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, overload",
    [
        ("aten::from_file", "out"),
        ("debugprims::load_tensor", ""),
        ("inductor::_reinterpret_tensor", ""),
        ("aten::set_", "source_Storage"),
        ("aten::_add_relu", "out"),  # harmless, but no kernel library of ExecuTorch has it
        ("nowhere::add", "out"),
        ("__builtins__::open", ""),
    ],
)
def test_any_operator_outside_the_table_is_refused_at_load(name, overload):
    program = Runtime.get().load_program(hostile.renamed_add(name, overload))
    full = f"{name}.{overload}" if overload else name
    with pytest.raises(MissingKernelError) as info:
        program.load_method("forward")
    assert info.value.operators == [full]
    _assert_refusal_names(str(info.value), full)


def test_an_operator_of_the_table_still_runs_like_eager():
    # the same edit to an operator ExecuTorch's portable library has: it loads and runs
    method = Runtime.get().load_program(hostile.renamed_add("aten::sub")).load_method("forward")
    x = torch.randn(4)
    [got] = method.execute([x])
    torch.testing.assert_close(got, x - 1)


def test_an_operator_allowed_explicitly_runs():
    name = "aten::_add_relu.out"
    pte = hostile.renamed_add("aten::_add_relu")
    assert registry.lookup(name) is None
    allow_torch_operator(name)
    try:
        method = Runtime.get().load_program(pte).load_method("forward")
        x = torch.randn(4) - 1
        [got] = method.execute([x])
        torch.testing.assert_close(got, torch.relu(x + 1))
    finally:
        registry._kernels.pop(name)
    with pytest.raises(MissingKernelError):
        Runtime.get().load_program(pte).load_method("forward")


def test_allowing_an_operator_torch_lacks_is_an_error():
    with pytest.raises(ValueError, match="nowhere::op.out"):
        allow_torch_operator("nowhere::op.out")


@pytest.mark.parametrize("isolate", [False, True])
def test_etmetal_run_refuses_it_and_creates_no_file(tmp_path, isolate):
    target = tmp_path / "planted"
    path = tmp_path / "hostile.pte"
    path.write_bytes(hostile.from_file_program(str(target)))
    argv = [sys.executable, "-m", "etmetal.scripts", "run", str(path), "--runs", "1"]
    result = subprocess.run(
        argv + (["--isolate"] if isolate else []),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ETMETAL_TRUST_NATIVE_CODE": "1"},  # trust is about .so files only
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "etmetal run:" in result.stderr and "Traceback" not in result.stderr
    _assert_refusal_names(result.stderr, "aten::from_file")
    assert not target.exists()


def test_isolated_delegated_program_refuses_its_portable_from_file(demos, tmp_path):
    # a delegated program: the isolate path (worker process for the delegate) is taken,
    # and the portable instruction that names from_file is refused before anything runs
    target = tmp_path / "planted"
    pte = hostile.appended_from_file(demos["patch_embedding"].pte, str(target))
    program = Runtime.get().load_program(pte, isolate=True, trust_native_code=True)
    with pytest.raises(MissingKernelError, match="aten::from_file"):
        program.load_method("forward")
    assert not target.exists()


def test_enum_codes_out_of_range_are_errors_not_crashes(tmp_path):
    # torch casts an int passed for a dtype / memory format without a range check, and a
    # None passed for a tensor becomes an undefined tensor (the process dies); etmetal's
    # kernels check both first. In a subprocess, so a
    # crash shows as a signal.
    script = tmp_path / "enums.py"
    script.write_text(
        "import torch\n"
        "from etmetal.runtime.kernels import registry\n"
        "x, out = torch.randn(2, 3), torch.empty(2, 3)\n"
        "for name, args in [('aten::_to_copy.out', (x, False, 4, out)),\n"
        "                   ('aten::clone.out', (x, -1, out)),\n"
        "                   ('aten::copy.out', (None, x, False, out)),\n"
        "                   ('aten::full.out', ([2], 1.0, out))]:\n"
        "    try:\n"
        "        registry.lookup(name)(*args)\n"
        "        print(name, 'ran')\n"
        "    except Exception as exc:\n"
        "        print(name, type(exc).__name__, exc)\n"
        "registry.lookup('aten::_to_copy.out')(x, False, 1, out)\n"
        "print('valid code ran', torch.equal(out, x))\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "aten::_to_copy.out ValueError 4 is not a valid MemoryFormat code" in lines[0]
    assert "aten::clone.out ValueError -1 is not a valid MemoryFormat code" in lines[1]
    assert "aten::copy.out TypeError argument 'self' must be a tensor" in lines[2]
    assert lines[3] == "aten::full.out ran" and lines[4] == "valid code ran True"
