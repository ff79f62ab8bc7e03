"""The checked-in list of operators ExecuTorch's kernel libraries provide, against the stock
runtime's own operator registry and the kernel yaml files the executorch package ships."""

from __future__ import annotations

from pathlib import Path

import executorch
import torch
import yaml
from executorch.runtime import Runtime as StockRuntime

from etmetal.runtime.kernels import registry, table
from etmetal.runtime.kernels.stock_operators import STOCK_OPERATORS


def test_every_operator_the_stock_runtime_registers_is_in_the_table():
    stock = set(StockRuntime.get().operator_registry.operator_names)
    assert len(stock) >= 240
    assert stock <= STOCK_OPERATORS, sorted(stock - STOCK_OPERATORS)


def test_the_checked_in_list_is_what_the_stock_sources_generate():
    # read the portable library's yaml here, independently of the generator
    [root] = list(executorch.__path__)[:1]
    entries = yaml.safe_load((Path(root) / "kernels/portable/functions.yaml").read_text())
    portable = {f"aten::{e['op']}" for e in entries if "op" in e}
    assert len(portable) > 150 and portable <= STOCK_OPERATORS
    assert set(table.generate()) == STOCK_OPERATORS


def test_core_aten_out_variants_are_what_torch_tags_core():
    # independently of the generator: torch's own tag on the functional overload
    core = table.CORE_ATEN_OUT_VARIANTS
    assert "aten::sort.values" in core and torch.Tag.core in torch.ops.aten.sort.default.tags
    for name in core:
        packet = getattr(torch.ops.aten, name.split("::")[1].split(".")[0])
        assert any(torch.Tag.core in getattr(packet, o).tags for o in packet.overloads()), name
        assert name not in STOCK_OPERATORS
    assert set(table.core_aten_out_variants(frozenset(STOCK_OPERATORS))) == core
    # nothing with file, process or unchecked-memory effects is core ATen
    assert not {"aten::from_file.out", "aten::set.source_Storage_out"} & core


def test_names_outside_the_table_get_no_kernel_and_names_inside_do():
    assert registry.lookup("aten::add.out") is not None
    for name in (
        "aten::from_file",
        "aten::from_file.out",
        "inductor::_reinterpret_tensor",
        "aten::_add_relu.out",
        "aten::set_.source_Storage",
        "nowhere::x.out",
    ):
        assert registry.lookup(name) is None, name  # fmt: skip
    assert table.EXTRA_OPERATORS.isdisjoint(STOCK_OPERATORS | table.CORE_ATEN_OUT_VARIANTS)
