"""``etmetal demo`` end to end: both demo models lowered, saved, run by the delegate and
checked against eager (the command's exit status), and the saved programs re-run."""

from __future__ import annotations

import argparse

import torch

from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.runtime import Runtime
from etmetal.scripts import demo


def test_demo_command_lowers_runs_and_matches_eager(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(["--out-dir", str(tmp_path), "--runs", "2", "--no-view-copy"])
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    for model in DEMO_MODELS:
        assert f"== {model.name}" in out
        assert "0 kept out" in out  # the whole model runs in the Metal delegate
        # the saved program, loaded afresh, matches eager on new inputs
        module, _ = get_demo(model.name)
        xs = model.make_inputs(torch.Generator().manual_seed(7))
        path = tmp_path / f"{model.name}.pte"
        method = Runtime.get().load_program(path, trust_native_code=True).load_method("forward")
        [got] = method.execute(list(xs))
        method.destroy()
        with torch.no_grad():
            torch.testing.assert_close(got, module(*xs), atol=model.atol, rtol=model.rtol)
    assert out.count(": OK") == len(DEMO_MODELS)
