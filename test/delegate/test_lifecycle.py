"""The delegate's load-time checks and lifetimes: integrity, trust opt-in, the private .so
directory, call arity, external data, borrowed inputs, dynamic shapes, memory release."""

from __future__ import annotations

import gc
import stat
import tempfile
from pathlib import Path

import pytest
import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from pte_surgery import flip_byte, metal_blobs, replace_blobs, split_named_data
from torch import nn

from etmetal.examples.metal_registry import get_model_and_inputs
from etmetal.runtime import (
    DelegateError,
    ExecutionError,
    InputError,
    IntegrityError,
    InvalidProgramError,
    Runtime,
    UntrustedNativeCodeError,
    metal_delegate,
)
from etmetal.shims import memory_stats
from etmetal.testing.pte_blobs import metal_delegates, replace_named

load = Runtime.get().load_program


@pytest.fixture
def linear(lowered):
    return lowered("registry:linear_bias", lambda: get_model_and_inputs("linear_bias"))


ONE_BLOB = {"compile_specs": [CompileSpec("share_weights", b"0")]}


@pytest.fixture
def linear_one_blob(lowered):
    """linear_bias in upstream's one-blob layout (the opt-out of weight sharing)."""
    return lowered(
        "registry:linear_bias:one_blob", lambda: (*get_model_and_inputs("linear_bias"), ONE_BLOB)
    )


@pytest.fixture(params=["shared", "one_blob"])
def linear_any(request, linear, linear_one_blob):
    """linear_bias in each constants layout."""
    low = linear if request.param == "shared" else linear_one_blob
    assert metal_delegates(low.pte)[0].layout == request.param
    return low


@pytest.fixture
def mm(lowered):
    return lowered("registry:mm", lambda: get_model_and_inputs("mm"))


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Point tempfile at an empty directory so the delegate's private dirs can be seen."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(metal_delegate.TRUST_ENV, raising=False)
    monkeypatch.delenv(metal_delegate.TRUSTED_BLOBS_ENV, raising=False)
    return tmp_path


def _dirs(root: Path) -> list[Path]:
    return sorted(root.glob(metal_delegate._TMP_PREFIX + "*"))


def test_untrusted_native_code_is_refused_with_how_to_opt_in(linear, private_tmp):
    digest = metal_blobs(linear.pte)[0][:64]
    with pytest.raises(UntrustedNativeCodeError) as info:
        load(linear.pte).load_method("forward")
    message = str(info.value)
    for hint in (
        "trust_native_code=True",
        "trusted_blob_hashes",
        digest,
        "ETMETAL_TRUST_NATIVE_CODE=1",
    ):
        assert hint in message
    assert _dirs(private_tmp) == []  # nothing written for refused code


@pytest.mark.parametrize("how", ["flag", "hash", "hash_with_suffix", "env", "env_hashes"])
def test_each_opt_in_loads_the_program(how, linear, private_tmp, monkeypatch):
    so_key = metal_blobs(linear.pte)[0]
    kwargs: dict = {}
    if how == "flag":
        kwargs["trust_native_code"] = True
    elif how == "hash":
        kwargs["trusted_blob_hashes"] = [so_key[:64]]
    elif how == "hash_with_suffix":
        kwargs["trusted_blob_hashes"] = [so_key.upper().replace("_SO_BLOB", "_so_blob")]
    elif how == "env":
        monkeypatch.setenv(metal_delegate.TRUST_ENV, "1")
    else:
        monkeypatch.setenv(metal_delegate.TRUSTED_BLOBS_ENV, f"{'0' * 64},{so_key[:64]}")
    method = load(linear.pte, **kwargs).load_method("forward")
    [out] = method.execute(list(linear.inputs))
    torch.testing.assert_close(out, linear.module(*linear.inputs).detach())
    method.destroy()


def test_a_hash_allow_list_without_this_so_is_refused(linear, private_tmp):
    with pytest.raises(UntrustedNativeCodeError):
        load(linear.pte, trusted_blob_hashes=["0" * 64]).load_method("forward")


@pytest.mark.parametrize("which", ["so", "weights", "constant"])
@pytest.mark.parametrize("where", ["middle", "first_byte"])
def test_altered_blob_is_refused_at_load(which, where, linear_any, private_tmp):
    # weights: the one blob, or the index naming the constants; constant: the shared
    # layout's entry of the linear's weight (the one-blob layout has none)
    d = metal_delegates(linear_any.pte)[0]
    if which == "constant" and d.layout != "shared":
        return
    if which == "constant":
        [key] = [c["key"] for c in d.index if c["fqn"].endswith("weight")]
        blob = d.constants[key]
    else:
        key, blob = (d.keys[0], d.so) if which == "so" else (d.keys[1], d.weights)
    altered = flip_byte(linear_any.pte, blob, at=0 if where == "first_byte" else None)
    program = load(altered, trust_native_code=True)  # the file itself still parses
    with pytest.raises(IntegrityError, match="altered or corrupted") as info:
        program.load_method("forward")
    assert key in str(info.value)
    assert _dirs(private_tmp) == []


def test_private_directory_lifetime(linear_any, private_tmp):
    linear = linear_any
    method = load(linear.pte, trust_native_code=True).load_method("forward")
    [d] = _dirs(private_tmp)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    # the .so, and the link wrapper that binds it to the shim bridge (removed with it)
    assert sorted(p.name for p in d.iterdir()) == [".etmetal-link", "delegate.so"]
    assert (d / "delegate.so").read_bytes() == metal_blobs(linear.pte)[1]
    method.execute(list(linear.inputs))
    assert memory_stats().storages > 0  # constants borrowed from the blob or lent
    method.destroy()
    assert _dirs(private_tmp) == []
    assert memory_stats().storages == 0 and memory_stats().tensors == 0
    with pytest.raises(Exception, match="destroyed"):
        method.execute(list(linear.inputs))


def test_garbage_collected_method_releases_everything(linear_any, private_tmp):
    method = load(linear_any.pte, trust_native_code=True).load_method("forward")
    method.execute(list(linear_any.inputs))
    del method
    gc.collect()
    assert _dirs(private_tmp) == [] and memory_stats().storages == 0


def test_so_that_does_not_load_cleans_up(linear, private_tmp):
    broken = replace_blobs(linear.pte, so=b"\x7fELF not really a shared object" * 8)
    with pytest.raises(DelegateError, match="loading the .so failed"):
        load(broken, trust_native_code=True).load_method("forward")
    assert _dirs(private_tmp) == [] and memory_stats().storages == 0


def test_call_arity_is_checked_at_load(linear_one_blob, mm, private_tmp):
    # mm's .so takes two inputs; linear's delegate call passes one input and one output
    swapped = replace_blobs(linear_one_blob.pte, so=metal_blobs(mm.pte)[1], weights=b"")
    with pytest.raises(InvalidProgramError, match="passes 2 values, the .so takes 2 inputs and 1"):
        load(swapped, trust_native_code=True).load_method("forward")
    assert _dirs(private_tmp) == [] and memory_stats().storages == 0


def test_weights_blob_too_small_is_refused(linear_one_blob, private_tmp):
    pte = linear_one_blob.pte
    truncated = replace_blobs(pte, weights=metal_blobs(pte)[3][:16])
    with pytest.raises(DelegateError, match="weights blob has 16 bytes"):
        load(truncated, trust_native_code=True).load_method("forward")
    assert _dirs(private_tmp) == [] and memory_stats().storages == 0


def test_shared_constant_too_small_is_refused(linear, private_tmp):
    # the constant's bytes are cut and its key rehashed (so its integrity check passes)
    d = metal_delegates(linear.pte)[0]
    [entry] = [c for c in d.index if c["fqn"].endswith("weight")]
    truncated = replace_named(linear.pte, {entry["key"]: d.constants[entry["key"]][:16]})
    want = rf"constant {entry['name']!r} .* has 16 bytes in named data .* the index says "
    with pytest.raises(InvalidProgramError, match=want + str(entry["nbytes"])):
        load(truncated, trust_native_code=True).load_method("forward")
    assert _dirs(private_tmp) == [] and memory_stats().storages == 0


def test_blobs_from_an_external_data_file(linear_any, private_tmp, tmp_path):
    linear = linear_any
    pte, ptd = split_named_data(linear.pte)
    with pytest.raises(InvalidProgramError, match="data_files"):
        load(pte, trust_native_code=True).load_method("forward")
    (tmp_path / "m.ptd").write_bytes(ptd)
    method = load(pte, data_files=tmp_path / "m.ptd", trust_native_code=True).load_method("forward")
    [out] = method.execute(list(linear.inputs))
    torch.testing.assert_close(out, linear.module(*linear.inputs).detach())
    method.destroy()


def test_inputs_are_borrowed_not_copied(linear, monkeypatch):
    from etmetal.shims import model_run as shim_model

    seen: list[tuple[int, bool]] = []
    describe = shim_model.tensor_from_torch

    def recording(t, storage):
        seen.append((t.data_ptr(), storage.owned))
        return describe(t, storage)

    monkeypatch.setattr(shim_model, "tensor_from_torch", recording)
    method = load(linear.pte, trust_native_code=True).load_method("forward")
    try:
        inputs = list(linear.inputs)
        want = linear.module(*inputs)
        torch.testing.assert_close(method.execute(inputs)[0], want)
        # a whole-program delegate: the .so read the caller's own memory, as borrowed storage
        assert seen == [(t.data_ptr(), False) for t in inputs]
        # an input laid out otherwise is copied into the planned memory first, as before
        planned = [method._vals[i] for i, _ in method._inputs]
        odd = [t.t().contiguous().t() if t.dim() == 2 else t for t in inputs]
        assert any(o.stride() != p.stride() for o, p in zip(odd, planned))
        method.destroy()
        method = load(linear.pte, trust_native_code=True).load_method("forward")
        planned = [method._vals[i] for i, _ in method._inputs]
        seen.clear()
        torch.testing.assert_close(method.execute(odd)[0], want)
        assert seen == [(p.data_ptr(), False) for p in planned]
    finally:
        method.destroy()


class Head(nn.Module):
    # (a chunk + cat here gets its batch specialized to the example's during edge lowering,
    # before the delegate sees it: the range constraint becomes [5, 5])
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2.0


def test_dynamic_batch_passes_through(lowered):
    batch = torch.export.Dim("batch", min=2, max=64)
    low = lowered(
        "dynamic_head",
        lambda: (Head(), (torch.randn(5, 8),), {"dynamic_shapes": {"x": {0: batch}}}),
    )
    method = load(low.pte, trust_native_code=True).load_method("forward")
    for n in (2, 17, 64, 3):
        x = torch.randn(n, 8)
        [out] = method.execute([x])
        assert out.shape == (n, 6)
        torch.testing.assert_close(out, low.module(x).detach())
    with pytest.raises(InputError):
        method.execute([torch.randn(65, 8)])
    method.destroy()
    assert memory_stats().storages == 0


def test_metal_delegate_is_a_builtin_of_the_runtime_registry(monkeypatch):
    from etmetal.runtime import delegates, lookup_delegate, register_delegate

    assert lookup_delegate("MetalBackend") is metal_delegate.MetalDelegate
    assert "MetalBackend" in delegates.registered_delegates()
    # found even after a registry reset; a registered (e.g. entry-point) class wins
    monkeypatch.setattr(delegates, "_delegates", {})
    assert lookup_delegate("MetalBackend") is metal_delegate.MetalDelegate

    class Override(metal_delegate.MetalDelegate):
        pass

    register_delegate("MetalBackend", Override)
    assert lookup_delegate("MetalBackend") is Override


def test_so_compiled_for_other_shapes_fails_at_execute_with_a_clear_error(linear_one_blob, lowered):
    linear = linear_one_blob
    other = lowered(
        "registry:linear_bias_batch1:one_blob",
        lambda: (*get_model_and_inputs("linear_bias_batch1"), ONE_BLOB),
    )
    _, so, _, weights = metal_blobs(other.pte)  # same arity, compiled for a [1, 7] input
    swapped = replace_blobs(linear.pte, so=so, weights=weights)
    method = load(swapped, trust_native_code=True).load_method("forward")
    for _ in range(2):  # the failure leaks nothing and repeats the same way
        with pytest.raises(ExecutionError, match=r"delegate 0.*expected: 1, but got: 127"):
            method.execute(list(linear.inputs))
        assert memory_stats().tensors == 2  # only the two constants stay registered
    method.destroy()
    assert memory_stats().storages == 0
