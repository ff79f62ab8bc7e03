"""The layout property on the stock runtime: seeded random channels-last / contiguous
programs (``etmetal.testing.layout_programs``), each lowered in the four
``_skip_dim_order`` x ``remove_view_copy`` configurations with ``etmetal.backend_config()``
and run on ExecuTorch's own ``executorch.runtime``, against eager PyTorch.

The default run checks a slice (``ETMETAL_LAYOUT_PROGRAMS`` programs, default 10, of the
sequence ``ETMETAL_LAYOUT_SEED``, default 0); ``etmetal regress view-copy --generated 300``
runs the whole acceptance set and prints the table.
"""

from __future__ import annotations

import os

import pytest

from etmetal.testing.layout_programs import generated_program, generated_programs
from etmetal.testing.layout_property import check_program, contiguous_violations

COUNT = int(os.environ.get("ETMETAL_LAYOUT_PROGRAMS", "10"))
SEED = int(os.environ.get("ETMETAL_LAYOUT_SEED", "0"))


@pytest.mark.parametrize("index", range(COUNT))
def test_generated_program_is_correct_or_refused_on_the_stock_runtime(index):
    program = generated_program(SEED, index)
    cells = check_program(program)
    if isinstance(cells, str):
        pytest.fail(f"{program.name} does not run in eager or export: {cells}")
    bad = [
        f"skip_dim_order={c.skip_dim_order} remove_view_copy={c.remove_view_copy}: "
        f"{c.status} {c.detail}"
        for c in cells
        if c.lowering == "etmetal" and c.status not in ("correct", "refused")
    ]
    assert not bad, f"{program.name}: {program.description}\n" + "\n".join(bad)
    # contiguous programs: no conversion added, every stock view kept
    assert not contiguous_violations(program, cells)


def test_generator_is_deterministic_and_covers_the_layouts():
    first = [p.description for p in generated_programs(40, seed=SEED)]
    assert first == [p.description for p in generated_programs(40, seed=SEED)]
    programs = generated_programs(40, seed=SEED)
    kinds = {step.kind for p in programs for step in p.steps}
    for kind in ("conv", "channel_split", "flatten_unflatten", "softmax", "cat", "chunk"):
        assert kind in kinds
    assert any(p.contiguous for p in programs) and any(p.input_channels_last for p in programs)
    assert {p.input_shape[0] for p in programs} == {1, 2}
    assert 1 in {p.input_shape[1] for p in programs}


def test_generated_module_matches_its_description_shapes():
    # each step's recorded shape is the shape eager produces: the generator's bookkeeping
    # (which decides which steps are legal) agrees with PyTorch
    import torch

    for program in generated_programs(25, seed=SEED):
        module = program.module()
        x = program.run_inputs()[0]
        with torch.no_grad():
            for index, step in enumerate(program.steps):
                if step.kind.startswith("head_") or step.kind == "two_outputs":
                    break
                x = module._apply(str(index), step, x)
                expected = step.get("shape")
                if expected is not None:
                    assert tuple(x.shape) == tuple(expected), (program.name, str(step))


def test_cli_generated_mode_prints_the_table(capsys):
    from etmetal.scripts.cli import main as cli

    assert cli(["regress", "view-copy", "--generated", "2", "--seed", str(SEED)]) == 0
    out = capsys.readouterr().out
    header, _, stock, mine, *rest = out.splitlines()
    assert header.split()[:3] == ["lowering", "correct", "wrong"]
    assert stock.split()[0] == "stock" and mine.split()[0] == "etmetal"
    assert mine.split()[1:] == ["8", "0", "0", "0", "0", "8"]  # 2 programs x 4 configs
    assert "conversions added per program" in out
