"""etmetal's bridge and torch's own AOTI runner in one process.

The bridge stays out of the process-wide symbol scope, so a ``link_libtorch=True`` ``.so``
loaded after an etmetal model still binds to libtorch (and the etmetal model to etmetal).
Run in a subprocess: a wrong binding would crash, and must not take the test process along.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from etmetal.backend.aoti_compile import compile_exported_program


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)).permute(1, 0) * 2


_SCRIPT = r"""
import json, sys
import torch
from etmetal.shims import AotiModel, load_bridge

etm_so, etm_w, torch_so, torch_w, data = sys.argv[1:6]
x = torch.load(data)
bridge = load_bridge()
first = bridge.calls
model = AotiModel(etm_so, open(etm_w, "rb").read())
(etm_out,) = model.run([x])
etm_calls = bridge.calls - first

before = bridge.calls
runner = torch._C._aoti.AOTIModelContainerRunnerCpu(torch_so, 1)
runner.update_constant_buffer_from_blob(torch_w)
(torch_out,) = runner.run([x])
torch_calls = bridge.calls - before

(etm_again,) = model.run([x])  # etmetal still bound to etmetal after torch's .so loaded
model.close()
torch.save({"etm": etm_out, "torch": torch_out, "etm_again": etm_again}, data + ".out")
print(json.dumps({"etm_calls": etm_calls, "torch_calls": torch_calls}))
"""


@pytest.fixture(scope="module")
def builds():
    torch.manual_seed(0)
    module = Tiny().eval()
    x = torch.randn(4, 16)
    ep = torch.export.export(module, (x,))
    etm = compile_exported_program(ep, link_libtorch=False)
    tch = compile_exported_program(ep, link_libtorch=True)
    with torch.no_grad():
        want = module(x)
    return etm, tch, x, want


def test_etmetal_model_then_torch_runner_in_one_process(builds, tmp_path):
    etm, tch, x, want = builds
    data = tmp_path / "x.pt"
    torch.save(x, data)
    script = tmp_path / "coexist.py"
    script.write_text(_SCRIPT)
    args = [str(etm.so_path), str(etm.weights_path), str(tch.so_path), str(tch.weights_path)]
    proc = subprocess.run(
        [sys.executable, str(script), *args, str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["etm_calls"] > 0  # the etmetal model's shims reached etmetal
    assert counts["torch_calls"] == 0  # torch's .so bound to libtorch, not to the bridge
    outs = torch.load(str(data) + ".out")
    torch.testing.assert_close(outs["etm"], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["torch"], want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["etm"], outs["torch"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(outs["etm_again"], want, atol=1e-5, rtol=1e-5)


def test_bridge_symbols_stay_out_of_the_global_scope():
    import ctypes

    from etmetal.shims import load_bridge

    bridge = load_bridge()
    scope = ctypes.CDLL(None)
    assert "aoti_torch_empty_strided" in bridge.exported
    assert not hasattr(scope, "aoti_torch_empty_strided")
    assert bridge.shadowed(["aoti_torch_empty_strided", "aoti_torch_get_dim"]) == []
