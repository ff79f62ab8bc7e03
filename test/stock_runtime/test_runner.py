"""``etmetal_runner`` on programs without a delegate: what it runs equals eager PyTorch and
ExecuTorch's own Python runtime (``executorch.runtime``), no Python is mapped into it,
and bad input gives an error naming what was wrong.

The delegated programs (etmetal's native MetalBackend in the runner) are in
``test_runner_delegated.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import etmetal
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.stock_runtime import runner


def _export(module, inputs, path: Path, **config) -> Path:
    """No delegate; etmetal's layout-safe config, which the stock kernels need for the
    channels-last patch embedding (the upstream defect etmetal's ``layout/`` repairs)."""
    from executorch.exir import to_edge

    manager = to_edge(torch.export.export(module.eval(), inputs)).to_executorch(
        etmetal.backend_config(**config)
    )
    path.write_bytes(manager.buffer)
    return path


def _stock(path: Path, inputs, method: str = "forward", data_files=()):
    """The same program through ExecuTorch's Python runtime over the same libexecutorch."""
    from executorch.runtime import Runtime

    # the Python binding takes one data file
    data_path = str(data_files[0]) if data_files else None
    program = Runtime.get().load_program(path, data_path=data_path)
    return list(program.load_method(method).execute(list(inputs)))


def _eager(module, inputs):
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.fixture(scope="module")
def demo_programs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("runner-demo")
    programs = {}
    for demo in DEMO_MODELS:
        module, inputs = get_demo(demo.name)
        path = _export(module, inputs, directory / f"{demo.name}.pte")
        programs[demo.name] = (module, inputs, path)
    return programs


def test_the_runner_has_every_kernel_of_the_stock_python_runtime():
    listed = subprocess.run(
        [str(runner.runner_path()), "--list-operators"], capture_output=True, text=True, check=True
    ).stdout.split()
    # the stock runtime as a fresh interpreter has it: other tests of this process load
    # kernel libraries of their own (torchao's, the quantized ops) into its registry
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "from executorch.runtime import Runtime\n"
            "print('\\n'.join(Runtime.get().operator_registry.operator_names))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    python_side = set(fresh.stdout.split())
    assert len(python_side) >= 200
    assert python_side <= set(listed), sorted(python_side - set(listed))[:10]


@pytest.mark.parametrize("name", [d.name for d in DEMO_MODELS])
def test_demo_program_matches_eager_and_the_stock_python_runtime(demo_programs, name):
    module, inputs, path = demo_programs[name]
    outputs = runner.run_native(path, list(inputs), backend_libs=[])
    expected = _eager(module, inputs)
    stock = _stock(path, inputs)
    assert len(outputs) == len(expected) == len(stock)
    for got, want, ref in zip(outputs, expected, stock):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        # same library, same kernels, same plan: bit for bit
        assert torch.equal(got, ref)


def test_generated_inputs_are_read_back_and_reproducible(demo_programs):
    module, _, path = demo_programs["transformer_block"]
    first = runner.run_runner(path, generate="seed:7", backend_libs=[])
    again = runner.run_runner(path, generate="seed:7", backend_libs=[])
    other = runner.run_runner(path, generate="seed:8", backend_libs=[])
    assert torch.equal(first.inputs[0], again.inputs[0])
    assert not torch.equal(first.inputs[0], other.inputs[0])
    # the pattern is multiples of 1/8 in [-1, 1]
    assert ((first.inputs[0] * 8).round() == first.inputs[0] * 8).all()
    assert first.inputs[0].abs().max() <= 1
    torch.testing.assert_close(
        first.outputs[0], _eager(module, first.inputs)[0], rtol=1e-4, atol=1e-5
    )
    ones = runner.run_runner(path, generate="ones", backend_libs=[])
    assert torch.equal(ones.inputs[0], torch.ones_like(ones.inputs[0]))


def test_mmap_loader_iterations_and_summary(demo_programs):
    # several iterations: the plan reuses the input's memory, so each one sets it again
    module, inputs, path = demo_programs["patch_embedding"]
    result = runner.run_runner(path, list(inputs), loader="mmap", iterations=3, backend_libs=[])
    torch.testing.assert_close(result.outputs[0], _eager(module, inputs)[0], rtol=1e-4, atol=1e-5)
    assert len(result.manifest["execute_ms"]) == 3
    assert result.summary.startswith("etmetal_runner: ")
    assert "3 iteration(s)" in result.summary


def test_channels_last_and_integer_inputs(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x, idx):
            return torch.nn.functional.relu(x).sum(dim=(2, 3)), idx * 2 + 1

    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    idx = torch.tensor([1, 2, 3], dtype=torch.int64)
    path = _export(M(), (x, idx), tmp_path / "m.pte")
    spec = runner.describe(path)["inputs"]
    outputs = runner.run_native(path, [x, idx], backend_libs=[])
    for got, want, ref in zip(outputs, _eager(M(), (x, idx)), _stock(path, (x, idx))):
        torch.testing.assert_close(got, want)
        assert torch.equal(got, ref)
    assert spec[1]["dtype"] == "Long" and spec[1]["sizes"] == [3]


def test_external_data_file(tmp_path):
    from executorch.exir import to_edge

    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 2))
    x = torch.randn(3, 6)
    manager = to_edge(torch.export.export(model.eval(), (x,))).to_executorch(
        etmetal.backend_config(external_constants=True)
    )
    (tmp_path / "m.pte").write_bytes(manager.buffer)
    manager.write_tensor_data_to_file(str(tmp_path))
    ptds = sorted(tmp_path.glob("*.ptd"))
    assert ptds
    with pytest.raises(runner.NativeRunError) as missing:
        runner.run_native(tmp_path / "m.pte", [x], backend_libs=[])
    assert missing.value.code == 6 and "load_method('forward')" in missing.value.stderr
    got = runner.run_native(tmp_path / "m.pte", [x], data_files=ptds, backend_libs=[])[0]
    torch.testing.assert_close(got, _eager(model, (x,))[0], rtol=1e-4, atol=1e-5)
    assert torch.equal(got, _stock(tmp_path / "m.pte", (x,), data_files=ptds)[0])


def test_no_python_is_mapped_into_the_runner(demo_programs, tmp_path):
    _, inputs, path = demo_programs["transformer_block"]
    maps = tmp_path / "maps"
    runner.run_native(path, list(inputs), dump_maps=maps, backend_libs=[])
    mapped = {
        Path(line.split()[5]).name
        for line in maps.read_text().splitlines()
        if len(line.split()) >= 6
    }
    assert "libexecutorch.so" in mapped and "libexecutorch_kernels_optimized.so" in mapped
    python = sorted(n for n in mapped if n.startswith("libpython") or ".cpython-" in n)
    assert python == [], python


def _raw(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(runner.runner_path()), *args], capture_output=True, text=True, timeout=60
    )


def test_bad_input_files_give_errors_naming_the_input_and_file(demo_programs, tmp_path):
    _, inputs, path = demo_programs["transformer_block"]
    short = tmp_path / "short.bin"
    short.write_bytes(b"\0" * 12)
    proc = _raw(str(path), "--input", str(short), "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 7
    assert "input 0" in proc.stderr and str(short) in proc.stderr and "12 bytes" in proc.stderr
    assert "Float [2, 16, 64] = 8192 bytes" in proc.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()

    proc = _raw(str(path), "--input", str(tmp_path / "absent.bin"))
    assert proc.returncode == 3 and "absent.bin" in proc.stderr

    proc = _raw(str(path), "--input", str(short), "--input", str(short))
    assert proc.returncode == 7 and "2 --input file(s)" in proc.stderr

    with pytest.raises(runner.NativeRunError, match=r"input 0: torch.float64 \[2, 16, 64\]"):
        runner.run_native(path, [inputs[0].double()], backend_libs=[])


def test_bad_program_method_and_options_give_clear_errors(demo_programs, tmp_path):
    _, _, path = demo_programs["transformer_block"]
    proc = _raw(str(tmp_path / "absent.pte"))
    assert proc.returncode == 3 and "absent.pte" in proc.stderr

    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"not a program at all" * 10)
    proc = _raw(str(junk))
    assert proc.returncode == 4 and "Program::load" in proc.stderr and "junk.pte" in proc.stderr

    proc = _raw(str(path), "--method", "decode")
    assert proc.returncode == 5
    assert "no method 'decode'" in proc.stderr and "methods: forward" in proc.stderr

    for args in (
        ["--generate-inputs", "seed:"],
        ["--iterations", "0"],
        ["--frobnicate", "1"],
        ["--loader", "tape"],
    ):
        proc = _raw(str(path), *args)
        assert proc.returncode == 2, args
        assert args[0] in proc.stderr

    proc = _raw(str(path), "--backend-lib", str(tmp_path / "absent.so"))
    assert proc.returncode == 10 and "absent.so" in proc.stderr

    with pytest.raises(runner.NativeRunError, match="no method 'decode'") as err:
        runner.run_native(path, None, method="decode", backend_libs=[])
    assert err.value.code == 5
