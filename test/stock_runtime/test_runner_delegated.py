"""``etmetal_runner`` with etmetal's native MetalBackend (``--backend-lib``): the demo models
and the two-method LM's ``decode``, lowered for ``host``, run from files in a process without
Python, and equal eager PyTorch; the trust policy reaches it through the environment; its
``--etdump`` and the Python stock runtime's ETDump both hold the delegate's execute event,
read back with ExecuTorch's Inspector."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from etmetal.backend.lowering import lower
from etmetal.examples import llm
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.stock_runtime import runner

DELEGATE_EVENT = "MetalBackend.execute"


def _eager(module, inputs):
    with torch.no_grad():
        out = module(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _demo_programs(directory: Path, target: str) -> dict:
    """Each demo model lowered whole for ``target``, as a file: name -> (module, inputs, path)."""
    programs = {}
    for demo in DEMO_MODELS:
        module, inputs = get_demo(demo.name)
        program, partitioner = lower(module, inputs, target=target)
        assert partitioner.report.kept_out == []
        path = directory / f"{demo.name}.pte"
        path.write_bytes(program.buffer)
        programs[demo.name] = (module.eval(), inputs, path)
    return programs


@pytest.fixture(scope="module")
def demo_programs(tmp_path_factory):
    return _demo_programs(tmp_path_factory.mktemp("runner-delegated"), "host")


def _mapped_names(maps: Path) -> set[str]:
    fields = (line.split() for line in maps.read_text().splitlines())
    return {Path(f[5]).name for f in fields if len(f) >= 6}


@pytest.mark.parametrize("name", [d.name for d in DEMO_MODELS])
def test_demo_model_from_files_matches_eager_without_python(demo_programs, name, tmp_path):
    module, inputs, path = demo_programs[name]
    maps = tmp_path / "maps"
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        run_inputs = [
            x
            if seed == 0
            else torch.randn(x.shape, generator=gen).to(
                memory_format=(
                    torch.channels_last
                    if x.dim() == 4 and not x.is_contiguous()
                    else torch.contiguous_format
                )
            )
            for x in inputs
        ]
        result = runner.run_runner(path, run_inputs, trust_native_code=True, dump_maps=maps)
        expected = _eager(module, run_inputs)
        assert len(result.outputs) == len(expected)
        for got, want in zip(result.outputs, expected):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    mapped = _mapped_names(maps)
    # the delegate really ran in this process: etmetal's backend and the delegate's .so
    assert "libetmetal_stock.so" in mapped and "libexecutorch.so" in mapped
    assert sorted(n for n in mapped if n.startswith("libpython") or ".cpython-" in n) == []


@pytest.fixture(scope="module")
def mps_demo_programs(tmp_path_factory):
    """The demo models lowered for ``mps_emulated``: Inductor's Metal program, whose shader
    libraries the runner loads from etmetal's compiled-shader cache."""
    return _demo_programs(tmp_path_factory.mktemp("runner-mps"), "mps_emulated")


@pytest.mark.parametrize("name", [d.name for d in DEMO_MODELS])
def test_mps_emulated_demo_model_from_files_matches_eager_without_python(
    mps_demo_programs, name, tmp_path
):
    module, inputs, path = mps_demo_programs[name]
    maps = tmp_path / "maps"
    result = runner.run_runner(path, list(inputs), trust_native_code=True, dump_maps=maps)
    expected = _eager(module, inputs)
    assert len(result.outputs) == len(expected)
    for got, want in zip(result.outputs, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    mapped = _mapped_names(maps)
    # the Metal kernels ran in this process: compiled shader libraries and their dispatcher
    assert "libetmetal_stock.so" in mapped and "libmsl.so" in mapped
    assert "libetmetal_msl_dispatch.so" in mapped
    assert sorted(n for n in mapped if n.startswith("libpython") or ".cpython-" in n) == []


def test_untrusted_program_is_refused_with_how_to_opt_in(demo_programs):
    module, inputs, path = demo_programs["transformer_block"]
    with pytest.raises(runner.NativeRunError) as refused:
        runner.run_native(path, list(inputs))
    assert refused.value.code == 6  # load_method failed
    message = refused.value.stderr
    # the backend's whole message, with every way to opt in
    assert "AccessFailed" in message and "ETMETAL_TRUST_NATIVE_CODE=1" in message
    digest = re.search(r"ETMETAL_TRUSTED_BLOBS=([0-9a-f]{64})", message).group(1)
    # trusting that one digest (ETMETAL_TRUSTED_BLOBS in the runner's environment) runs it
    got = runner.run_native(path, list(inputs), trusted_blob_hashes=[digest])
    torch.testing.assert_close(got[0], _eager(module, inputs)[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(runner.NativeRunError, match="AccessFailed"):
        runner.run_native(path, list(inputs), trusted_blob_hashes=["0" * 64])


@pytest.mark.parametrize("layout", ["shared", "one_blob"])
def test_lm_decode_from_files_matches_eager(tiny_lm_programs, layout):
    """The programs ``etmetal bench llm --config tiny`` measures (weights and KV cache
    shared across methods, and upstream's one-blob layout), lowered once per suite run."""
    from etmetal.bench.llm import program_paths

    path = program_paths("tiny", tiny_lm_programs)[layout]
    token = torch.tensor([[5]], dtype=torch.long)
    for pos in (0, 3):
        input_pos = torch.tensor([pos], dtype=torch.long)
        got = runner.run_native(path, [token, input_pos], method="decode", trust_native_code=True)
        # each run is a fresh process whose KV cache starts at zero, like a fresh model's
        fresh = llm.make_decoder_lm(llm.CONFIGS["tiny"])
        want = _eager(fresh, (token, input_pos))
        assert len(got) == len(want) == 1
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)


def _delegate_events(etdump: Path) -> list:
    from executorch.devtools import Inspector

    inspector = Inspector(etdump_path=str(etdump))
    return [e for block in inspector.event_blocks for e in block.events if e.name == DELEGATE_EVENT]


def test_runner_etdump_holds_the_delegate_event(demo_programs, tmp_path):
    _, inputs, path = demo_programs["transformer_block"]
    etdump = tmp_path / "run.etdp"
    runner.run_native(path, list(inputs), trust_native_code=True, etdump=etdump, iterations=2)
    events = _delegate_events(etdump)
    assert len(events) == 1 and events[0].is_delegated_op
    # one timing per execute
    assert len(events[0].perf_data.raw) == 2 and min(events[0].perf_data.raw) > 0


def test_mps_emulated_etdump_holds_the_execute_and_its_mps_fallbacks(mps_demo_programs, tmp_path):
    from executorch.devtools import Inspector

    _, inputs, path = mps_demo_programs["transformer_block"]
    etdump = tmp_path / "mps.etdp"
    runner.run_native(path, list(inputs), trust_native_code=True, etdump=etdump)
    inspector = Inspector(etdump_path=str(etdump))
    names = [e.name for block in inspector.event_blocks for e in block.events]
    assert names.count(DELEGATE_EVENT) == 1, names
    # the Metal wrapper's matrix products run as the emulated device's fallbacks
    assert any(n.startswith("aoti_torch_mps_") for n in names), names


def test_stock_python_runtime_etdump_holds_the_delegate_event(demo_programs, tmp_path):
    from executorch.runtime import Runtime

    import etmetal.stock_runtime as stock

    module, inputs, path = demo_programs["transformer_block"]
    stock.register(trust_native_code=True)
    try:
        program = Runtime.get().load_program(path, enable_etdump=True, debug_buffer_size=1 << 20)
        out = program.load_method("forward").execute(list(inputs))
        torch.testing.assert_close(out[0], _eager(module, inputs)[0], rtol=1e-4, atol=1e-4)
        etdump = tmp_path / "stock.etdp"
        program.write_etdump_result_to_file(str(etdump), str(tmp_path / "debug.bin"))
    finally:
        stock.register()
    events = _delegate_events(etdump)
    assert len(events) == 1 and events[0].is_delegated_op


@pytest.mark.parametrize("name", [d.name for d in DEMO_MODELS])
def test_mutated_programs_give_errors_not_crashes(demo_programs, name, tmp_path):
    """Random byte changes anywhere in a trusted delegated .pte: the runner exits with one of
    its error codes (or runs, if the bytes it changed do not matter), never by a signal."""
    import random
    import subprocess

    from etmetal.stock_runtime import library_path

    _, _, path = demo_programs[name]
    original = path.read_bytes()
    rng = random.Random(name)
    mutated = tmp_path / "mutated.pte"
    codes = []
    for _ in range(25):
        data = bytearray(original)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        mutated.write_bytes(bytes(data))
        proc = subprocess.run(
            [
                str(runner.runner_path()),
                str(mutated),
                "--generate-inputs",
                "seed:1",
                "--backend-lib",
                str(library_path()),
                "--libtorch-cpu",
                str(runner.libtorch_cpu_path()),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=runner.trust_environment(True, ()),
        )
        assert proc.returncode == 0 or proc.returncode in runner.EXIT_CODES, proc.stderr
        assert proc.returncode == 0 or "etmetal_runner: " in proc.stderr
        codes.append(proc.returncode)
    assert any(codes)  # some mutation was caught


def test_the_backend_library_registers_metal_backend_in_the_runner():
    import subprocess

    from etmetal.stock_runtime import library_path

    exe = str(runner.runner_path())
    alone = subprocess.run([exe, "--list-backends"], capture_output=True, text=True, check=True)
    assert "MetalBackend" not in alone.stdout.split()
    lib = ["--backend-lib", str(library_path())]
    listed = subprocess.run(
        [exe, *lib, "--list-backends"], capture_output=True, text=True, check=True
    )
    assert "MetalBackend" in listed.stdout.split()
    bad = subprocess.run(
        [exe, *lib, "--libtorch-cpu", "/nonexistent/libtorch_cpu.so", "--list-backends"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 10 and "/nonexistent/libtorch_cpu.so" in bad.stderr
