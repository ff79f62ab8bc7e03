"""Programs lowered for ``host`` and run by the stock ExecuTorch runtime
(``executorch.runtime``) with etmetal's native MetalBackend registered."""

from __future__ import annotations

import pytest
import torch
from executorch.runtime import Runtime

import etmetal.stock_runtime as stock
from etmetal.backend.lowering import lower


class StockLowered:
    """One module lowered with ``MetalPartitioner(target="host")`` (plus ``lower`` kwargs)."""

    def __init__(self, module: torch.nn.Module, inputs: tuple, **kwargs) -> None:
        self.module = module.eval()
        self.inputs = inputs
        program, self.partitioner = lower(module, inputs, **{"target": "host", **kwargs})
        self.pte: bytes = program.buffer

    def execute(self, inputs) -> list[torch.Tensor]:
        """One execute of ``forward`` in the stock runtime (program and method freed after)."""
        program = Runtime.get().load_program(self.pte)
        method = program.load_method("forward")
        out = [t.clone() for t in method.execute(list(inputs))]
        # freed by reference counting here, no cycle holds them (the tests' native counts
        # show it); a full gc.collect() would cost ~0.4 s in a process this size
        del method, program
        return out


@pytest.fixture
def trusted():
    """etmetal's backend registered, trusting native code (the tests' own programs); per
    test, since other tests set the process-wide policy in between."""
    stock.register(trust_native_code=True)
    yield
    stock.register()


@pytest.fixture(scope="session")
def stock_lowered():
    """``stock_lowered(key, make)``: ``make()`` returns (module, inputs[, lower kwargs])."""
    cache: dict[str, StockLowered] = {}

    def get(key: str, make) -> StockLowered:
        if key not in cache:
            made = make()
            cache[key] = StockLowered(made[0], made[1], **(made[2] if len(made) > 2 else {}))
        return cache[key]

    return get


def fresh_like(inputs, seed: int) -> tuple[torch.Tensor, ...]:
    """New values with each example input's shape, dtype and layout."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if x.dtype.is_floating_point:
            y = torch.randn(x.shape, generator=gen, dtype=x.dtype)
        else:
            y = x.clone()
        channels_last = x.dim() == 4 and not x.is_contiguous()
        out.append(y.to(memory_format=torch.channels_last) if channels_last else y)
    return tuple(out)


def assert_matches(got, expected, atol: float, rtol: float) -> None:
    expected = expected if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol)
