"""``etmetal bench native``'s transformer case, at a small scale: every arm runs the one
exported program, the outputs are checked before timing, and the rows say where each
shim call was served."""

from __future__ import annotations

import torch


def test_transformer_case_runs_every_arm_on_one_program(tmp_path, capsys):
    from etmetal.bench.native_transformer import bench_transformer

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        result = bench_transformer(repeat=5, budget=30.0, tmp=tmp_path, scale=8)
    finally:
        torch.set_num_threads(threads)
    rows = result["transformer"]
    assert list(rows) == ["torch_aoti", "etmetal_shims", "etmetal_pte", "stock_runtime"]
    for arm, row in rows.items():
        assert row["cpu_us"] > 0 and row["wall_us"] > 0
        if arm != "torch_aoti":
            native, python = row["counts"]
            assert native > 0 and python == 0  # a steady run reaches no Python shim
            assert row["paired"] > 0
    assert rows["etmetal_shims"]["counts"] == rows["etmetal_pte"]["counts"]
    assert "transformer (4-layer transformer" in capsys.readouterr().out
