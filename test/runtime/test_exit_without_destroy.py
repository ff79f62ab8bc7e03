"""A script that runs a host or ``mps_emulated`` delegate and exits without destroying its
method exits cleanly (status 0, no ``std::terminate``), in process and isolated.

The model containers used to be deleted by finalizers after the shims were unbound at exit;
AOTI throws on a failed ``aoti_torch_delete_tensor_object`` inside a destructor, which
aborted the interpreter. Each case runs in its own interpreter, as a user's script would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from etmetal.backend.lowering import lower

# the user's script: load, execute, print the output, exit without destroy()
SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    from etmetal.runtime import Runtime

    pte, isolate, ending = sys.argv[1], sys.argv[2] == "isolate", sys.argv[3]
    torch.manual_seed(1)
    x = torch.randn(2, 8)
    program = Runtime.get().load_program(pte, trust_native_code=True, isolate=isolate)
    method = program.load_method("forward")
    print(repr(method.execute([x])[0].tolist()), flush=True)
    if ending == "abrupt":  # the host vanishes: an isolated worker sees its socket close
        sys.stderr.flush()
        os._exit(0)
    """
)


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + 1.0


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    model = Small().eval()
    torch.manual_seed(1)
    x = torch.randn(2, 8)  # the script's input (same seed)
    with torch.no_grad():
        expected = model(x)
    return model, x, expected


@pytest.fixture(scope="module")
def ptes(small, tmp_path_factory):
    model, x, _ = small
    out = {}
    for target in ("host", "mps_emulated"):
        program, _ = lower(model, (x,), target=target)
        path = tmp_path_factory.mktemp("exit") / f"small_{target}.pte"
        path.write_bytes(program.buffer)
        out[target] = path
    return out


def _run_script(tmp_path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    # its own temp directory: a host leaving by os._exit skips the removal of its
    # delegate directories (a later process sweeps them), which is not under test here
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # stderr is read to EOF, so an isolated worker outliving the host is waited for too
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp)},
    )


@pytest.mark.parametrize(
    "target, isolate, ending",
    [
        ("host", "inprocess", "normal"),
        ("mps_emulated", "inprocess", "normal"),
        ("host", "isolate", "normal"),
        ("mps_emulated", "isolate", "abrupt"),
    ],
)
def test_exit_without_destroy_is_clean(ptes, small, tmp_path, target, isolate, ending):
    _, _, expected = small
    proc = _run_script(tmp_path, str(ptes[target]), isolate, ending)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert "Aborted" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.tensor(eval(proc.stdout.strip().splitlines()[-1]))  # noqa: S307 - our own print
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
