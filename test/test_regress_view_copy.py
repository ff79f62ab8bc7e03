"""The view_copy layout matrix on ExecuTorch's own runtime: every case x the four
``_skip_dim_order`` x ``remove_view_copy`` configs, against eager PyTorch.

etmetal's lowering must be exact; the stock lowering's failure on the patch embedding is
asserted too, as an independent record of the defect the pass fixes.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
import torch

from etmetal.examples.view_copy import CASES, get_case
from etmetal.scripts.cli import main as cli
from etmetal.testing import view_copy_matrix as regress

CONFIGS = [
    pytest.param(skip, remove, id=f"skip_dim_order={skip}-remove_view_copy={remove}")
    for skip, remove in regress.CONFIGS
]


@functools.cache
def _lowered(case_name: str) -> dict:
    """Every lowering of one case, built once per worker process."""
    return regress.lower_case(get_case(case_name))


def _eager(case_name: str) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    case = get_case(case_name)
    inputs = case.run_inputs()
    with torch.no_grad():
        out = case.module()(*inputs)
    return inputs, [out] if isinstance(out, torch.Tensor) else list(out)


def _cell(case_name: str, skip: bool, remove: bool, lowering: str):
    manager = _lowered(case_name)[(skip, remove, lowering)]
    if isinstance(manager, Exception):
        raise AssertionError(f"{lowering} lowering of {case_name} failed") from manager
    return manager


@pytest.mark.parametrize("skip_dim_order, remove_view_copy", CONFIGS)
@pytest.mark.parametrize("case_name", [c.name for c in CASES])
def test_etmetal_lowering_matches_eager_on_the_stock_runtime(
    case_name, skip_dim_order, remove_view_copy
):
    manager = _cell(case_name, skip_dim_order, remove_view_copy, "etmetal")
    inputs, expected = _eager(case_name)
    outputs = regress.run_on_stock_runtime(manager.buffer, inputs)
    assert len(outputs) == len(expected)
    atol = 0.0 if get_case(case_name).bitwise else regress.TOLERANCE
    for actual, reference in zip(outputs, expected):
        torch.testing.assert_close(actual, reference, rtol=0, atol=atol)


@pytest.mark.parametrize("skip_dim_order, remove_view_copy", CONFIGS)
@pytest.mark.parametrize("case_name", [c.name for c in CASES if c.stock_safe])
def test_safe_views_stay_views(case_name, skip_dim_order, remove_view_copy):
    # on row-major models etmetal must not cost anything: the stock lowering is right
    # there, and etmetal keeps every view (and adds no copies) that the stock one makes
    stock = _cell(case_name, skip_dim_order, remove_view_copy, "stock")
    mine = _cell(case_name, skip_dim_order, remove_view_copy, "etmetal")
    inputs, expected = _eager(case_name)
    torch.testing.assert_close(
        regress.run_on_stock_runtime(stock.buffer, inputs)[0],
        expected[0],
        rtol=0,
        atol=regress.TOLERANCE,
    )
    assert regress.count_view_ops(mine) == regress.count_view_ops(stock)
    assert regress.kernel_calls(mine, "dim_order_ops::_to_dim_order_copy") == (
        regress.kernel_calls(stock, "dim_order_ops::_to_dim_order_copy")
    )
    if remove_view_copy:
        assert regress.count_view_ops(mine)[0] == 0


@pytest.mark.parametrize("skip_dim_order", [False, True])
def test_stock_lowering_of_patch_embedding_is_wrong_or_rejected(skip_dim_order):
    """The defect, measured independently of etmetal's code: the stock view_copy
    replacement gives silently wrong tokens, the kept view_copy is refused (0x12)."""
    inputs, expected = _eager("patch_embed")
    viewed = _cell("patch_embed", skip_dim_order, True, "stock")
    wrong = regress.run_on_stock_runtime(viewed.buffer, inputs)[0]
    assert (wrong - expected[0]).abs().max().item() > 1.0
    kept = _cell("patch_embed", skip_dim_order, False, "stock")
    with pytest.raises(RuntimeError, match=r"0x12 in aten::view_copy"):
        regress.run_on_stock_runtime(kept.buffer, inputs)


def test_matrix_rows_and_json(capsys):
    assert cli(["regress", "view-copy", "--json", "--case", "patch_embed"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 8
    assert {r["lowering"] for r in rows} == {"stock", "etmetal"}
    assert all(r["exact"] for r in rows if r["lowering"] == "etmetal")
    assert not any(r["exact"] for r in rows if r["lowering"] == "stock")
    assert {r["error"] for r in rows if r["error"]} == {"0x12 in aten::view_copy.out"}


def test_exit_code_is_nonzero_when_an_etmetal_row_is_not_exact(monkeypatch, capsys):
    # swap etmetal's config for the stock one: its rows must then fail the command
    from executorch.exir import ExecutorchBackendConfig

    import etmetal.layout.config as config_module

    monkeypatch.setattr(
        config_module,
        "backend_config",
        lambda remove_view_copy=True: ExecutorchBackendConfig(remove_view_copy=remove_view_copy),
    )
    assert cli(["regress", "view-copy", "--case", "patch_embed"]) == 1
    out = capsys.readouterr().out
    assert "etmetal: 0/4 exact" in out


def test_unknown_case_is_an_error_naming_it(capsys):
    assert cli(["regress", "view-copy", "--case", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def _etmetal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "etmetal.scripts", *args], capture_output=True, text=True
    )


def test_cli_regress_view_copy_prints_the_table():
    # two cases keep the subprocess short; the full matrix is the parametrized tests above
    cases = ["patch_embed", "contiguous"]
    out = _etmetal("regress", "view-copy", *(arg for c in cases for arg in ("--case", c)))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["model", "skip_dim_order", "remove_view_copy", "lowering"]
    body = [line for line in lines[2:] if line.strip() and not line.startswith("etmetal:")]
    assert len(body) == len(cases) * 8
    assert {line.split()[0] for line in body} == set(cases)
    assert all("exact" in line for line in body if line.split()[3] == "etmetal")
    assert any("0x12 in aten::view_copy.out" in line for line in body)
    assert any("WRONG" in line for line in body)
    n = len(cases) * 4
    assert f"etmetal: {n}/{n} exact" in out.stdout


def test_cli_demo_runs_the_matrix():
    out = _etmetal("demo", "--case", "patch_embed")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "patch_embed" in out.stdout and "etmetal: 4/4 exact" in out.stdout
