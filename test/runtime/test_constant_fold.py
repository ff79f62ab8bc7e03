"""Load-time folding of layout copies of constants (``src/etmetal/runtime/constant_fold.py``).

References: the same program with folding turned off (bit-exact: the same ATen kernels
run, only once instead of every execute), eager PyTorch and the stock runtime.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etmetal.runtime import Runtime, constant_fold


class TwoLinears(nn.Module):
    """Two linears and elementwise work after them: memory planning reuses the slot of
    the first transposed weight for later values, which a fold that kept the result in
    its planned slot would clobber on the next execute."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.b(h * 2.0 + 1.0).sigmoid()


class ReturnsTransposedWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x @ self.w, self.w.t().contiguous() + 0.0


def _method(pte: bytes, fold: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not fold:
            m.setattr(constant_fold, "FOLDABLE", frozenset())
        return Runtime.get().load_program(pte).load_method("forward")


def _permute_steps(method) -> int:
    # folded steps leave the hot loop, so only the unfolded copies are still listed
    return sum("permute_copy" in label for chain in method._chains for label in chain.labels)


def test_folded_program_matches_unfolded_bit_for_bit(lower, stock, monkeypatch):
    model = TwoLinears().eval()
    x0 = torch.randn(3, 16)
    pte = lower(model, (x0,))
    folded, plain = _method(pte, True, monkeypatch), _method(pte, False, monkeypatch)
    assert _permute_steps(plain) == 2 and _permute_steps(folded) == 0  # one per weight
    for seed in range(3):  # several executes: the folded weights must survive each one
        x = torch.randn(3, 16, generator=torch.Generator().manual_seed(seed))
        got, want = folded.execute([x])[0], plain.execute([x])[0]
        assert torch.equal(got, want)
        torch.testing.assert_close(got, model(x))
        torch.testing.assert_close(got, stock(pte, [x])[0], rtol=1e-5, atol=1e-5)


def test_copy_that_feeds_a_method_output_is_not_folded(lower, monkeypatch):
    model = ReturnsTransposedWeight().eval()
    x = torch.randn(2, 4)
    pte = lower(model, (x,))
    method = _method(pte, True, monkeypatch)
    out = method.execute([x])
    torch.testing.assert_close(out[0], x @ model.w)
    torch.testing.assert_close(out[1], model.w.t())
    out2 = method.execute([x + 1])
    torch.testing.assert_close(out2[1], model.w.t())


def test_fold_failure_is_a_load_error_naming_the_instruction(lower, monkeypatch):
    from etmetal.runtime.errors import InvalidProgramError

    pte = lower(TwoLinears().eval(), (torch.randn(3, 16),))

    def broken(*args):
        raise RuntimeError("kernel exploded")

    # make the folded kernel fail: replace permute_copy's resolved kernel at load time
    real_fold = constant_fold.fold_constants

    def fold_with_broken_kernel(plan, table, kernels, names, split_args, dynamic):
        for i, name in names.items():
            if name == "aten::permute_copy.out":
                kernels[i] = broken
        return real_fold(plan, table, kernels, names, split_args, dynamic)

    monkeypatch.setattr("etmetal.runtime.instructions.fold_constants", fold_with_broken_kernel)
    with pytest.raises(InvalidProgramError, match=r"permute_copy.*failed at load.*exploded"):
        Runtime.get().load_program(pte).load_method("forward")


class BatchedLSTM(nn.Module):
    """``nn.LSTM`` on a batch of 8: the emitter leaves the input projection's weight, after
    ``permute_copy`` + ``expand_copy`` of constants, in a slot that ``bmm`` reads through a
    second value at the same bytes (the no-op expand's alias), and the planner gives those
    bytes to an earlier activation. A fold of the expand would leave ``bmm`` reading that
    activation (ExecuTorch's operator suite, ``test_lstm_batch_sizes``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size=64, hidden_size=32, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def test_copy_read_through_an_aliasing_slot_is_not_folded(lower, stock, monkeypatch):
    torch.manual_seed(0)
    model = BatchedLSTM().eval()
    x = torch.randn(8, 10, 64)
    pte = lower(model, (x,))
    folded = _method(pte, True, monkeypatch)
    for seed in range(2):
        x = torch.randn(8, 10, 64, generator=torch.Generator().manual_seed(seed))
        got = folded.execute([x])[0]
        torch.testing.assert_close(got, stock(pte, [x])[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)


class EncoderLayer(nn.Module):
    """A transformer encoder layer: memory planning gives the bytes of every transposed
    weight to later activations, which later views (the emitter's aliases of reshapes)
    read only after a kernel wrote them; every weight's copy still folds."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_weights_fold_when_their_bytes_are_reused_after_a_write(lower, stock, monkeypatch):
    torch.manual_seed(0)
    model = EncoderLayer().eval()
    x = torch.randn(6, 2, 32)
    pte = lower(model, (x,))
    folded, plain = _method(pte, True, monkeypatch), _method(pte, False, monkeypatch)
    assert _permute_steps(plain) >= 4  # the linears' weights at least
    weights = sum(p.dim() == 2 for p in model.parameters())
    assert _permute_steps(plain) - _permute_steps(folded) >= weights
    for seed in range(2):
        x = torch.randn(6, 2, 32, generator=torch.Generator().manual_seed(seed))
        got = folded.execute([x])[0]
        assert torch.equal(got, plain.execute([x])[0])
        torch.testing.assert_close(got, stock(pte, [x])[0], rtol=1e-5, atol=1e-5)
