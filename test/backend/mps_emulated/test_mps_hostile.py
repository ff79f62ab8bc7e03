"""The emulated Metal device under a hostile ``.so`` (issue 24): each case calls the C shims
as a ``.so`` does, in a fresh process so that a crash shows as a signal, and must end in an
error code whose ``last_error`` says what was wrong, never quoting a foreign file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from etmetal.testing.mps_hostile import CASES, SECRET

EXPECTED = {
    "use_after_free": r"\[\[buffer\(0\)\]\] was deleted before the dispatch \(use after free\)",
    "int_into_pointer": r"set_arg_int into \[\[buffer\(0\)\]\], which takes a buffer",
    "int_into_float": r"set_arg_int into \[\[buffer\(1\)\]\], which takes a 4-byte float",
    "memcpy_source_overrun": r"aoti_torch_mps_memcpy source .* not inside",
    "memcpy_tail_overrun": r"aoti_torch_mps_memcpy source .* not inside",
    "memcpy_destination_overrun": r"aoti_torch_mps_memcpy destination",
    "memcpy_foreign_source": r"aoti_torch_mps_memcpy source .* not inside",
    "copy_buffer_source_overrun": r"aoti_torch_mps_copy_buffer source",
    "grid_wraps": r"grid size 4294967296 in dimension 0 exceeds 2\^32-1",
    "grid_product_wraps": r"more than the launch limit",
    "launch_too_large": r"2147483648 threads, more than the launch limit of 268435456 "
    r"\(set ETMETAL_MPS_MAX_THREADS",
    # an absolute path into the temp folder, wherever TMPDIR puts it
    "include_absolute": r"#include of '/[^']*etmetal-foreign-[^']*\.h' refused",
    "include_system": r"#include of '/etc/shadow' refused",
    "include_traversal": r"#include of '\.\./\.\..*etc/passwd' refused",
    "include_behind_comment": r"#include of '.*etmetal-foreign-.*' refused",
    "include_digraph": r"#include of '.*etmetal-foreign-.*' refused",
    "include_spliced": r"#include of '.*etmetal-foreign-.*' refused",
    "include_by_macro": r"#include F: a shader library may only #include",
    "include_next": r"#include_next <metal_stdlib>: a shader library may only",
    "include_c10_traversal": r"#include of 'c10/metal/\.\./.*' refused",
}


def test_every_case_has_an_expectation():
    assert sorted(EXPECTED) == sorted(CASES)


def _run(case: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ETMETAL_MPS_MAX_THREADS"}
    return subprocess.run(
        [sys.executable, "-m", "etmetal.testing.mps_hostile", case],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_hostile_call_is_an_error_code_not_a_crash(case):
    import re

    proc = _run(case)
    assert proc.returncode == 0, f"{case}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 1, f"{case}: {out}"
    assert re.search(EXPECTED[case], out["error"]), f"{case}: {out['error']}"
    assert SECRET not in out["error"] and SECRET not in proc.stderr


def test_the_launch_limit_is_an_environment_variable():
    env = {**os.environ, "ETMETAL_MPS_MAX_THREADS": "1000"}
    code = (
        "from etmetal.testing import mps_hostile as h\n"
        "lib = h._lib(); fn = h._bound_fill(lib, 0)\n"
        "a = lib.aoti_torch_mps_dispatch_single(fn, 1000)\n"
        "fn = h._bound_fill(lib, 0)\n"
        "print(a, lib.aoti_torch_mps_dispatch_single(fn, 1001))\n"
        "print(h._error())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    first, message = proc.stdout.splitlines()[:2]
    assert first.split() == ["0", "1"]
    assert "1001 threads, more than the launch limit of 1000" in message
