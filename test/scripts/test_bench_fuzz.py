"""``etmetal bench fuzz --runtime stock``: the CLI runs the stock runtime's arm of the fuzz campaign."""

from __future__ import annotations

import pytest


def _bench_args(*argv: str):
    import argparse

    from etmetal.scripts import bench_fuzz

    parser = argparse.ArgumentParser()
    bench_fuzz.add_arguments(parser)
    return bench_fuzz, parser.parse_args(list(argv))


def test_bench_fuzz_runs_the_stock_arm(capsys):
    bench_fuzz, args = _bench_args("--runtime", "stock", "--cases", "6")
    assert bench_fuzz.run(args) == 0
    out = capsys.readouterr().out
    assert "fuzz: 6 cases" in out and "stock runtime" in out and "0 crashes, 0 hangs" in out
    kinds = {part.split()[0] for part in out.split("by kind:")[1].strip().split(", ")}
    assert kinds == {"pte", "weights", "processed"}  # the shim-call kinds are etmetal's


def test_bench_fuzz_refuses_the_operators_family_on_the_stock_runtime():
    bench_fuzz, args = _bench_args("--runtime", "stock", "--family", "operators")
    with pytest.raises(SystemExit, match="delegate family only"):
        bench_fuzz.run(args)
