"""An ``mps_emulated`` program's shader libraries in the stock runtime, where no Python may
compile them: the native side loads a library only through a record of the stock shader
index (``etmetal.shims.emulated_mps.stock_msl``) whose MAC verifies under the cache's key and
whose library file has the sha256 it names; a missing or unverifiable record is compiled by a
Python subprocess when one is configured, and is otherwise an error naming the shim and the
record. Each run is a fresh ``etmetal_runner`` process (nothing memoized from an earlier
run), and a run without a compiler cannot hide a refused record behind a rebuild."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from etmetal.backend.lowering import lower
from etmetal.common.cache import root_mac
from etmetal.shims.emulated_mps import stock_msl
from etmetal.stock_runtime import runner

SHIM = "aoti_torch_mps_create_shader_library"


class Affine(torch.nn.Module):
    """An elementwise kernel whose constants Inductor writes into its Metal source, so the
    source (and its record) is this test run's own."""

    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.scale + self.shift)


@pytest.fixture(scope="module")
def unique_program(tmp_path_factory):
    gen = torch.Generator().manual_seed(torch.seed() % (1 << 31))
    scale, shift = (float(v) for v in torch.rand(2, generator=gen, dtype=torch.float64) + 1)
    module, x = Affine(scale, shift).eval(), torch.randn(4, 33)
    program, partitioner = lower(module, (x,), target="mps_emulated")
    assert partitioner.report.kept_out == []
    path = tmp_path_factory.mktemp("mps-shaders") / "affine.pte"
    path.write_bytes(program.buffer)
    return module, x, path


def _records() -> dict:
    directory = stock_msl.record_dir()
    return {p: p.read_bytes() for p in directory.glob("*.txt")} if directory.is_dir() else {}


def _run(path, x, monkeypatch, *, compiler: bool):
    # the runner takes ETMETAL_MSL_* from this environment when set: "" is no compiler
    monkeypatch.setenv("ETMETAL_MSL_PYTHON", sys.executable if compiler else "")
    return runner.run_native(path, [x], trust_native_code=True)


def _refused(path, x, monkeypatch) -> str:
    with pytest.raises(runner.NativeRunError) as refused:
        _run(path, x, monkeypatch, compiler=False)
    return refused.value.stderr


def test_shader_records_are_compiled_on_a_miss_verified_and_never_trusted_blindly(
    unique_program, monkeypatch
):
    module, x, path = unique_program
    with torch.no_grad():
        want = module(x)
    before = _records()
    # a source no record holds yet: without a compiler that is an error naming the shim
    message = _refused(path, x, monkeypatch)
    assert SHIM in message and "no compiler is configured" in message, message
    # with one, the runner's Python subprocess compiles it and publishes the record
    [got] = _run(path, x, monkeypatch, compiler=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # other workers may publish records meanwhile: this program's is the one the refusal names
    [key] = set(re.findall(r"\(record ([0-9a-f]{64})\)", message))
    new = {p: b for p, b in _records().items() if before.get(p) != b}
    assert stock_msl.record_dir() / f"{key}.txt" in new, sorted(new)
    record = stock_msl.record_dir() / f"{key}.txt"
    text = new[record]
    assert text.startswith(stock_msl.FORMAT.encode()) and b"\nmac " in text
    # a fresh process without a compiler now runs from the record
    [got] = _run(path, x, monkeypatch, compiler=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    library = re.search(rb"^library (.+)$", text, re.M).group(1).decode()
    try:
        # a record altered after it was written: its MAC no longer verifies
        record.write_bytes(text.replace(b"kernel 0 ", b"kernel 0  ", 1))
        message = _refused(path, x, monkeypatch)
        assert SHIM in message and "MAC does not verify" in message, message
        # a record with a valid MAC naming a library whose bytes are not the recorded ones
        forged = stock_msl.record_dir() / "forged-libmsl.so"
        data = bytearray(Path(library).read_bytes())
        data[len(data) // 2] ^= 0xFF
        forged.write_bytes(bytes(data))
        body = text[: text.index(b"\nmac ") + 1].replace(library.encode(), str(forged).encode())
        record.write_bytes(body + f"mac {root_mac(body)}\n".encode())
        message = _refused(path, x, monkeypatch)
        assert SHIM in message and "does not match its record" in message, message
        assert "refusing to load it" in message
        # with a compiler, a refused record is rebuilt and replaced
        [got] = _run(path, x, monkeypatch, compiler=True)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert record.read_bytes() == text
    finally:
        (stock_msl.record_dir() / "forged-libmsl.so").unlink(missing_ok=True)
        if record.read_bytes() != text:
            record.write_bytes(text)
