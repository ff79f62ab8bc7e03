"""Load-time behaviour: validation errors, missing kernels, limits, and the prepared loop."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

from etmetal.runtime import (
    EtmetalRuntimeError,
    InputError,
    InvalidProgramError,
    MissingKernelError,
    ResourceLimitError,
    Runtime,
)
from etmetal.runtime.kernels import registry


class Small(torch.nn.Module):
    def forward(self, x, y):
        return (x * y + x).sin(), (x - y).abs()


@pytest.fixture(scope="module")
def small_pte(lower):
    return lower(Small(), (torch.randn(3, 4), torch.randn(3, 4)))


def _edit(pte: bytes, fn) -> bytes:
    parsed = copy.deepcopy(deserialize_pte_binary(pte))
    fn(parsed.program)
    return bytes(serialize_pte_binary(parsed))


def test_missing_kernels_are_listed_together_at_load(small_pte):
    def rename(program):
        ops = program.execution_plan[0].operators
        for op in ops:
            if op.name in ("aten::sin", "aten::abs"):
                op.name = op.name.replace("aten::", "nowhere::")

    pte = _edit(small_pte, rename)
    program = Runtime.get().load_program(pte)
    with pytest.raises(MissingKernelError) as info:
        program.load_method("forward")
    assert info.value.operators == ["nowhere::abs.out", "nowhere::sin.out"]
    assert "nowhere::abs.out" in str(info.value) and "nowhere::sin.out" in str(info.value)


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            lambda p: setattr(
                p.execution_plan[0].chains[0].instructions[0].instr_args, "op_index", 99
            ),
            "operator index 99",
        ),
        (
            lambda p: (
                p.execution_plan[0].chains[0].instructions[0].instr_args.args.__setitem__(0, 500)
            ),
            "argument index 500",
        ),
        (lambda p: setattr(p.execution_plan[0], "inputs", [0, 900]), "value index 900"),
        (lambda p: p.execution_plan[0].non_const_buffer_sizes.__setitem__(1, 8), "past the buffer"),
    ],
    ids=["op_index", "arg_index", "input_index", "buffer_size"],
)
def test_corrupt_indices_raise_errors_naming_the_place(small_pte, edit, match):
    pte = _edit(small_pte, edit)
    with pytest.raises(InvalidProgramError, match=match) as info:
        Runtime.get().load_program(pte).load_method("forward")
    assert "'forward'" in str(info.value)


def test_not_a_program_and_missing_file(tmp_path):
    with pytest.raises(InvalidProgramError, match="not an ExecuTorch program"):
        Runtime.get().load_program(b"\x00" * 64)
    with pytest.raises(InvalidProgramError, match="cannot read program file"):
        Runtime.get().load_program(tmp_path / "absent.pte")


def test_truncated_program_names_the_sizes(small_pte):
    with pytest.raises(InvalidProgramError):
        Runtime.get().load_program(small_pte[: len(small_pte) // 2]).load_method("forward")


def test_unknown_method_and_bad_inputs(small_pte):
    program = Runtime.get().load_program(small_pte)
    with pytest.raises(EtmetalRuntimeError, match="no method 'decode'"):
        program.load_method("decode")
    method = program.load_method("forward")
    with pytest.raises(InputError, match="takes 2 inputs, got 1"):
        method.execute([torch.randn(3, 4)])
    with pytest.raises(InputError, match="static shape"):
        method.execute([torch.randn(3, 5), torch.randn(3, 5)])


def test_memory_cap_refuses_with_the_numbers(small_pte):
    program = Runtime.get().load_program(small_pte, memory_cap=16)
    with pytest.raises(ResourceLimitError, match=r"over the cap of 16 bytes"):
        program.load_method("forward")


def test_metadata_mirrors_the_program(small_pte):
    meta = Runtime.get().load_program(small_pte).metadata("forward")
    assert meta.num_inputs() == 2 and meta.num_outputs() == 2
    spec = meta.input_tensor_meta(0)
    assert spec.dtype == torch.float32 and spec.sizes == (3, 4) and spec.dim_order == (0, 1)
    assert spec.nbytes == 48 and spec.is_memory_planned
    plan = deserialize_pte_binary(small_pte).program.execution_plan[0]
    assert list(meta.memory_planned_buffer_sizes) == plan.non_const_buffer_sizes[1:]


def test_execute_loop_does_no_kernel_lookups(small_pte, monkeypatch):
    method = Runtime.get().load_program(small_pte).load_method("forward")

    def fail(name):
        raise AssertionError(f"lookup({name!r}) during execute")

    monkeypatch.setattr(registry, "lookup", fail)
    monkeypatch.setattr(registry, "torch_op", fail)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    got = method.execute([x, y])
    for g, w in zip(got, Small()(x, y)):
        torch.testing.assert_close(g, w)


def test_kernel_failure_names_the_instruction_and_operator(small_pte):
    def bad(self, out):
        raise RuntimeError("boom")

    previous = registry._kernels.get("aten::abs.out")
    registry.register_kernel("aten::abs.out")(bad)
    try:
        method = Runtime.get().load_program(small_pte).load_method("forward")
        with pytest.raises(
            EtmetalRuntimeError,
            match=r"instruction \d+ \(aten::abs.out\) failed: RuntimeError: boom",
        ):
            method.execute([torch.randn(3, 4), torch.randn(3, 4)])
    finally:
        registry._kernels.pop("aten::abs.out")
        if previous is not None:
            registry._kernels["aten::abs.out"] = previous


def test_etmetal_run_cli_prints_outputs_and_latency(small_pte, tmp_path):
    path = tmp_path / "small.pte"
    path.write_bytes(small_pte)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.save(x, tmp_path / "x.pt")
    torch.save(y, tmp_path / "y.pt")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "etmetal.scripts",
            "run",
            str(path),
            "--runs",
            "3",
            "--inputs",
            str(tmp_path / "x.pt"),
            str(tmp_path / "y.pt"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    want = Small()(x, y)[0].double()
    assert f"min {want.min().item():.6g}" in result.stdout
    assert f"max {want.max().item():.6g}" in result.stdout
    assert "latency over 3 runs" in result.stdout
    random_run = subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", "run", str(path), "--runs", "1"],
        capture_output=True,
        text=True,
    )
    assert random_run.returncode == 0, random_run.stderr
    assert (
        "random inputs" in random_run.stdout
        and "output 1: torch.float32 [3, 4]" in random_run.stdout
    )
    broken = subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", "run", str(tmp_path / "x.pt")],
        capture_output=True,
        text=True,
    )
    assert broken.returncode == 1 and "not an ExecuTorch program" in broken.stderr


def test_free_instructions(small_pte):
    from executorch.exir import schema

    def free_output(program):
        plan = program.execution_plan[0]
        plan.chains[0].instructions.append(schema.Instruction(schema.FreeCall(plan.inputs[0])))

    method = Runtime.get().load_program(_edit(small_pte, free_output)).load_method("forward")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(method.execute([x, y])[0], Small()(x, y)[0])

    def free_scalar(program):
        plan = program.execution_plan[0]
        plan.values.append(schema.EValue(schema.Int(3)))
        index = len(plan.values) - 1
        plan.chains[0].instructions.append(schema.Instruction(schema.FreeCall(index)))

    with pytest.raises(InvalidProgramError, match="FreeCall target .* is not a tensor"):
        Runtime.get().load_program(_edit(small_pte, free_scalar)).load_method("forward")
