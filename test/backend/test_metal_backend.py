"""MetalBackend lowering on this (non-macOS) machine: the registry modules, mixed
programs, cache reuse, several methods, dynamic shapes, and backend-id resolution."""

from __future__ import annotations

import hashlib
import logging
import operator
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir._serialize._program import deserialize_pte_binary
from torch import nn

from etmetal.backend import aoti_compile
from etmetal.backend.lowering import lower
from etmetal.backend.metal_backend import BACKEND_ID, DELEGATE_ID, EtmetalMetalBackend
from etmetal.backend.metal_partitioner import MetalPartitioner
from etmetal.common.cache import cache_root
from etmetal.common.targets import HOST, MPS_EMULATED
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.testing.pte_blobs import metal_delegates

_EXTERN = re.compile(rb"aoti_torch_cpu_[A-Za-z0-9_]+")


def delegate_payloads(pte: bytes, plan: int = 0) -> list[tuple[str, bytes, bytes, bytes]]:
    """(delegate id, processed bytes, .so bytes, weights) of each delegate in a plan; the
    weights as the one blob AOTI wrote, whichever layout the program stores them in."""
    return [(d.id, d.processed, d.so, d.aoti_blob()) for d in metal_delegates(pte, plan)]


def operator_names(pte: bytes, plan: int = 0) -> list[str]:
    return [op.name for op in deserialize_pte_binary(pte).program.execution_plan[plan].operators]


@pytest.fixture(scope="module")
def registry_programs():
    """Lowered registry modules, shared by the tests of this module (compiled via the cache)."""
    cache: dict[str, tuple[bytes, MetalPartitioner]] = {}

    def get(name: str):
        if name not in cache:
            module, inputs = get_model_and_inputs(name)
            program, partitioner = lower(module, inputs, target="host")
            cache[name] = (program.buffer, partitioner)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_module_lowers_to_metal_delegates(name, registry_programs):
    pte, partitioner = registry_programs(name)
    payloads = delegate_payloads(pte)
    assert payloads, f"{name}: no delegate in forward"
    assert {p[0] for p in payloads} == {"MetalBackend"}
    # the whole forward is delegated: no operator left for the portable runtime
    assert partitioner.report.kept_out == []
    assert operator_names(pte) == []
    module, _ = get_model_and_inputs(name)
    param_bytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    predicted = {k for p in partitioner.report.partitions for k in p.fallbacks}
    imported: set[str] = set()
    for d in metal_delegates(pte):
        so_key, weights_key = d.keys[:2]
        so = d.so
        # content keys, verifiable from the stored bytes
        assert so_key == hashlib.sha256(so).hexdigest() + "_so_blob"
        if d.layout == "shared":
            # a host program for etmetal's runtime: one entry per constant, named by an
            # index, each keyed by its bytes' hash and its FQN
            assert d.constants
            assert weights_key == hashlib.sha256(d.weights).hexdigest() + "_weights_index"
            for entry in d.index:
                data = d.constants[entry["key"]]
                want = f"{hashlib.sha256(data).hexdigest()}_{entry['fqn']}_weight"
                assert entry["key"] == want and len(data) == entry["nbytes"]
        else:  # only a partition without constants keeps upstream's layout (empty)
            assert weights_key == hashlib.sha256(d.weights).hexdigest() + "_weights_blob"
            assert d.weights == b"", f"{name}: constants left in one blob"
        assert so[:4] == b"\x7fELF" and b"AOTInductorModelContainerCreateWithDevice" in so
        # built without libtorch: no libtorch dependency recorded in the .so
        assert b"libtorch_cpu.so" not in so
        imported |= {m.decode() for m in _EXTERN.findall(so)}
    # weights live outside the .so, in the named data
    assert len(b"".join(p[3] for p in payloads)) >= param_bytes
    # the partitioner's ahead-of-time prediction matches what Inductor really emitted
    assert predicted == imported, f"{name}: predicted {predicted}, compiled {imported}"


@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_delegate_computes_what_eager_does(name, registry_programs, tmp_path):
    # the packed .so and weights, run through etmetal's shims, against eager PyTorch
    from etmetal.shims.model import AotiModel

    pte, _ = registry_programs(name)
    [(_, _, so, weights)] = delegate_payloads(pte)
    so_path = tmp_path / "delegate.so"
    so_path.write_bytes(so)
    module, inputs = get_model_and_inputs(name)
    with AotiModel(so_path, weights) as model:
        got = model.run(list(inputs))
    with torch.no_grad():
        want = module(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    entry = REGISTRY[name]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=entry.atol, rtol=entry.rtol)


def test_mixed_program_keeps_unsupported_ops_outside(tmp_path):
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.sort(self.linear(x), dim=-1).values  # falls back to a missing shim
            return torch.relu(y) * 2.0

    module = Mixed()
    x = torch.randn(4, 8)
    program, partitioner = lower(module, (x,), target="host")
    report = partitioner.report
    assert [k.op for k in report.kept_out] == ["aten.sort.default"]
    assert "aoti_torch_cpu_sort_stable" in report.kept_out[0].reason
    assert "aten.sort.default" in report.text() and "aoti_torch_cpu_sort_stable" in report.text()
    pte = program.buffer
    # two partitions around the kept-out op, and the op itself as a portable kernel call
    assert [p[0] for p in delegate_payloads(pte)] == ["MetalBackend", "MetalBackend"]
    assert len(report.partitions) == 2
    assert operator_names(pte) == ["aten::sort"]
    # run the pieces in program order: delegate, portable sort (eager here), delegate
    from etmetal.shims.model import AotiModel

    def run(payload, args):
        so_path = tmp_path / f"{hashlib.sha256(payload[2]).hexdigest()}.so"
        so_path.write_bytes(payload[2])
        with AotiModel(so_path, payload[3]) as model:
            return model.run(args)

    first, second = delegate_payloads(pte)
    [h] = run(first, [x])
    [got] = run(second, [torch.sort(h, dim=-1).values])
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)


def test_relowering_hits_the_compile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ETMETAL_CACHE_DIR", str(tmp_path))  # a cold cache for this test
    module, inputs = get_model_and_inputs("narrow_last_dim")
    before = aoti_compile.compile_stats()
    first, _ = lower(module, inputs, target="host")
    mid = aoti_compile.compile_stats()
    again, _ = get_model_and_inputs("narrow_last_dim")
    second, _ = lower(again, inputs, target="host")
    after = aoti_compile.compile_stats()
    assert mid["compiles"] - before["compiles"] == 1
    assert after["compiles"] == mid["compiles"], "second lowering recompiled"
    assert after["cache_hits"] - mid["cache_hits"] == 1
    assert list((tmp_path / "aoti").glob("*/model.so"))
    assert delegate_payloads(first.buffer) == delegate_payloads(second.buffer)


def test_cache_key_changes_with_weights_and_shapes():
    module, inputs = get_model_and_inputs("mm_weight_param")
    ep = torch.export.export(module, inputs)
    other = get_model_and_inputs("mm_weight_param")[0]
    with torch.no_grad():
        other.weight.add_(1.0)
    ep_weights = torch.export.export(other, inputs)
    ep_shape = torch.export.export(module, (torch.randn(6, 4),))
    options = aoti_compile.aoti_options()
    keys = {aoti_compile.cache_key(e, "host", options) for e in (ep, ep_weights, ep_shape)}
    assert len(keys) == 3
    assert aoti_compile.cache_key(ep, "host", options) != aoti_compile.cache_key(ep, "mps", options)


def test_host_cache_key_holds_the_thread_count_the_cpp_kernels_are_generated_for():
    # Inductor's C++ kernels split reductions by the intra-op thread count at compile time, so
    # the transformer of `etmetal bench native` compiled under 2 threads differs from its 1-thread
    # build by 7e-07: serving one for the other broke bit-identity with torch's runner.
    module, inputs = get_model_and_inputs("mm_weight_param")
    ep = torch.export.export(module, inputs)
    options = aoti_compile.aoti_options()
    threads = torch.get_num_threads()
    keys = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            keys[n] = {
                t: aoti_compile.cache_key(ep, t, aoti_compile._keyed_options(t, options))
                for t in (HOST, MPS_EMULATED)
            }
    finally:
        torch.set_num_threads(threads)
    assert keys[1][HOST] != keys[2][HOST]
    assert keys[1][MPS_EMULATED] == keys[2][MPS_EMULATED]  # Metal kernels do not read it


class _ScaleA(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 3.0


class _ScaleB(nn.Module):  # the same computation, written on other lines
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 3.0


class _ScaleC(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 4.0


def test_cache_key_ignores_where_the_model_was_written():
    x = torch.randn(3, 5)
    a, b, c = (torch.export.export(m(), (x,)) for m in (_ScaleA, _ScaleB, _ScaleC))
    # the graphs differ in their source comments only (each names its own line)
    code = [e.graph_module.print_readable(print_output=False) for e in (a, b)]
    assert code[0] != code[1] and f"{Path(__file__).name}:" in code[0]
    options = aoti_compile.aoti_options()
    key_a, key_b, key_c = (aoti_compile.cache_key(e, "host", options) for e in (a, b, c))
    assert key_a == key_b
    assert key_c != key_a  # the constant is in the code, not in a comment


def test_several_methods_each_get_delegates():
    add, add_in = get_model_and_inputs("add")
    narrow, narrow_in = get_model_and_inputs("narrow_last_dim")
    programs = {
        "forward": torch.export.export(add, add_in),
        "narrow": torch.export.export(narrow, narrow_in),
    }
    partitioner = MetalPartitioner(target="host")
    edge = to_edge_transform_and_lower(programs, partitioner=[partitioner])
    pte = edge.to_executorch().buffer
    plans = deserialize_pte_binary(pte).program.execution_plan
    assert sorted(p.name for p in plans) == ["forward", "narrow"]
    for i in range(len(plans)):
        assert [p[0] for p in delegate_payloads(pte, i)] == ["MetalBackend"]
    assert len(partitioner.reports) == 2


def test_dynamic_batch_is_carried_into_the_compiled_wrapper(tmp_path):
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x)) * 2.0

    head = Head()
    batch = torch.export.Dim("batch", min=2, max=64)
    program, _ = lower(head, (torch.randn(5, 8),), target="host", dynamic_shapes={"x": {0: batch}})
    [(_, _, so, weights)] = delegate_payloads(program.buffer)
    wrappers = [
        p
        for p in cache_root().joinpath("aoti").glob("*/wrapper.cpp")
        if (p.parent / "model.so").read_bytes() == so
    ]
    assert wrappers, "compiled artifact not found in the cache"
    src = wrappers[0].read_text()
    # the batch is read from the input at run time and checked against the Dim's range
    assert re.search(r"int64_t s\d+ = arg\d+_1_size\[0\];", src)
    assert re.search(r"arg\d+_1_size\[0\] < 2\)", src) and re.search(r"_size\[0\] > 64\)", src)
    # and the one .so serves every batch in the range
    from etmetal.shims.model import AotiModel

    so_path = tmp_path / "dynamic.so"
    so_path.write_bytes(so)
    with AotiModel(so_path, weights) as model:
        for n in (2, 9, 64):
            x = torch.randn(n, 8)
            [got] = model.run([x])
            with torch.no_grad():
                torch.testing.assert_close(got, head(x), atol=1e-5, rtol=1e-5)


def test_to_backend_with_partitioner_instance():
    from executorch.exir.backend.backend_api import to_backend

    module, inputs = get_model_and_inputs("split_cat")
    edge = to_edge(torch.export.export(module, inputs))
    lowered = to_backend(edge.exported_program(), MetalPartitioner(target="host"))
    calls = [
        n
        for n in lowered.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
    ]
    assert calls and all("executorch_call_delegate" in str(n.target) for n in calls)


def test_backend_id_resolves_to_etmetal_and_reads_metal_backend():
    from executorch.exir.backend.backend_details import BackendDetails

    assert str(BACKEND_ID) == DELEGATE_ID == "MetalBackend"
    # exir's own comparison order (to_backend: backend_id == cls.__name__)
    matches = [c for c in BackendDetails.__subclasses__() if BACKEND_ID == c.__name__]  # noqa: SIM300
    assert matches == [EtmetalMetalBackend]
    by_name = {c.__name__: c for c in BackendDetails.__subclasses__()}
    assert by_name[BACKEND_ID] is EtmetalMetalBackend
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(BACKEND_ID)) == BACKEND_ID
    assert copy.deepcopy(BACKEND_ID) == BACKEND_ID


_UPSTREAM_FIRST = textwrap.dedent(
    """
    import logging, sys
    import torch
    import executorch.backends.apple.metal.metal_backend as upstream  # defined first
    import etmetal
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from executorch.exir.backend.backend_api import to_backend
    from executorch.exir._serialize._program import deserialize_pte_binary
    from etmetal.examples.metal_registry import get_model_and_inputs

    partitioner = etmetal.MetalPartitioner(target="host")  # defines etmetal's backend classes
    from executorch.exir.backend.backend_details import BackendDetails

    names = [c.__name__ for c in BackendDetails.__subclasses__()]
    # upstream's MetalBackend comes first, etmetal's same-named class later
    assert names.count("MetalBackend") == 2, names
    assert BackendDetails.__subclasses__()[names.index("MetalBackend")] is upstream.MetalBackend
    module, inputs = get_model_and_inputs("add")
    ep = torch.export.export(module, inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    pte = edge.to_executorch().buffer
    ids = [d.id for d in deserialize_pte_binary(pte).program.execution_plan[0].delegates]
    single = to_backend(to_edge(ep).exported_program(), etmetal.MetalPartitioner(target="host"))
    print("IDS", ids, len([n for n in single.graph.nodes if "delegate" in str(n.target)]))
    """
)


def test_upstream_metal_backend_imported_first_does_not_capture_lowering():
    # upstream's MetalBackend cannot preprocess off macOS (it moves the program to an MPS
    # device), so a successful lowering here shows etmetal's backend was used, by both exir
    # paths
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    done = subprocess.run(
        [sys.executable, "-c", _UPSTREAM_FIRST],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "IDS ['MetalBackend'] 1" in done.stdout


def test_upstream_metal_backend_fails_here_without_etmetal():
    # the reason for the distinct lookup name: upstream's preprocess cannot run on Linux.
    # With etmetal's torchao op schemas registered (the partitioner was imported), upstream
    # gets past torchao's missing MPS library and stops at the missing MPS device instead
    from executorch.backends.apple.metal.metal_backend import MetalBackend as Upstream

    module, inputs = get_model_and_inputs("add")
    ep = to_edge(torch.export.export(module, inputs)).exported_program()
    with pytest.raises(RuntimeError, match="support for mps devices"):
        Upstream.preprocess(ep, [])


def test_progress_is_reported_while_compiling(monkeypatch, caplog):
    monkeypatch.setattr(aoti_compile, "HEARTBEAT_SECONDS", 0.05)
    monkeypatch.setenv("ETMETAL_PROGRESS", "0")
    import time

    with (
        caplog.at_level(logging.INFO, logger="etmetal.backend.aoti_compile"),
        aoti_compile._progress("AOTI compile test"),
    ):
        time.sleep(0.3)
    beats = [r for r in caplog.records if "still compiling" in r.getMessage()]
    assert len(beats) >= 2 and "done in" in caplog.records[-1].getMessage()


def test_codesign_identity_is_carried_and_only_applied_on_macos(caplog):
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    module, inputs = get_model_and_inputs("add")
    specs = [CompileSpec("codesign_identity", b"-")]
    with caplog.at_level(logging.WARNING, logger="etmetal.backend.codesign"):
        program, _ = lower(module, inputs, target="host", compile_specs=specs)
    [delegate] = deserialize_pte_binary(program.buffer).program.execution_plan[0].delegates
    assert {s.key: s.value for s in delegate.compile_specs}["codesign_identity"] == b"-"
    if sys.platform != "darwin":
        assert any("needs macOS" in r.getMessage() for r in caplog.records)
        # unsigned: the .so is the cached artifact, byte for byte
        unsigned, _ = lower(*get_model_and_inputs("add"), target="host")
        assert delegate_payloads(program.buffer) == delegate_payloads(unsigned.buffer)


def test_export_command_writes_a_pte(tmp_path, capsys):
    from etmetal.scripts.cli import main

    out = tmp_path / "split_cat.pte"
    assert main(["export", "split_cat", "--target", "host", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1 MetalBackend delegate(s)" in printed and "Metal partition report" in printed
    assert [p[0] for p in delegate_payloads(out.read_bytes())] == ["MetalBackend"]


def test_export_command_rejects_unknown_models(capsys):
    from etmetal.scripts.cli import main

    with pytest.raises(SystemExit, match="neither a registry name"):
        main(["export", "no_such_model"])


def test_mutated_buffer_goes_into_the_delegate():
    class Accumulate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("acc", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.acc.add_(x)
            return self.acc * 2.0

    partitioner = MetalPartitioner(target="host")
    ep = torch.export.export(Accumulate(), (torch.randn(4),))
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    lowered = edge.exported_program()
    # the buffer and its update now live in the delegate, not in the program
    assert not lowered.graph_signature.buffers_to_mutate
    assert partitioner.report.kept_out == []
    assert [p[0] for p in delegate_payloads(edge.to_executorch().buffer)] == ["MetalBackend"]


def test_export_command_takes_module_callable(tmp_path, monkeypatch, capsys):
    from etmetal.scripts.cli import main

    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "class Twice(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x + x\n"
        "def bare():\n"
        "    return Twice()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "twice.pte"
    with pytest.raises(SystemExit, match="--input-shape"):
        main(["export", "my_models:bare", "-o", str(out)])
    args = ["export", "my_models:bare", "--input-shape", "10", "--target", "host", "-o", str(out)]
    assert main(args) == 0
    assert [p[0] for p in delegate_payloads(out.read_bytes())] == ["MetalBackend"]


class _Relu(nn.Module):
    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class _Twice(_Relu):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * 2.0


def _two_methods_one_linear(**partitioner_kwargs) -> tuple[bytes, dict, torch.Tensor]:
    """A program whose two methods hold the same nn.Linear (same FQNs, same tensors)."""
    torch.manual_seed(3)
    lin = nn.Linear(16, 24)
    x = torch.randn(2, 16)
    modules = {"relu": _Relu(lin).eval(), "twice": _Twice(lin).eval()}
    exports = {n: torch.export.export(m, (x,)) for n, m in modules.items()}
    partitioner = MetalPartitioner(target="host", **partitioner_kwargs)
    edge = to_edge_transform_and_lower(exports, partitioner=[partitioner])
    return edge.to_executorch().buffer, modules, x


@pytest.mark.parametrize(
    "how",
    [
        "default",
        "opt_out",  # CompileSpec("share_weights", b"0")
        "upstream",  # a program for ExecuTorch's Metal runtime
    ],
)
def test_constants_layout_follows_the_runtime(how):
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from etmetal.runtime import Runtime
    from etmetal.testing.pte_blobs import named_bytes

    kwargs = {
        "default": {},
        "opt_out": {"compile_specs": [CompileSpec("share_weights", b"0")]},
        "upstream": {"runtime": "upstream"},
    }[how]
    pte, modules, x = _two_methods_one_linear(**kwargs)
    named = named_bytes(pte)
    lin = modules["relu"].lin
    tensors = {"lin.weight": lin.weight, "lin.bias": lin.bias}
    delegates = [metal_delegates(pte, plan) for plan in range(2)]
    if how == "default":
        # each weight stored once for both methods, as its own entry
        shared = {k: v for k, v in named.items() if k.endswith("_weight")}
        assert sorted(k[65 : -len("_weight")] for k in shared) == sorted(tensors)
        for key, data in shared.items():
            want = tensors[key[65 : -len("_weight")]].detach().numpy().tobytes()
            assert data[: len(want)] == want
        [[a], [b]] = delegates
        assert a.layout == b.layout == "shared"
        assert sorted(a.constants) == sorted(b.constants) == sorted(shared)
    else:
        # upstream's layout: one blob per partition, nothing named per constant
        assert not any(k.endswith(("_weight", "_weights_index")) for k in named)
        for [d] in delegates:
            assert d.layout == "one_blob"
            assert lin.weight.detach().numpy().tobytes() in d.weights
    # every layout loads and runs in etmetal's runtime
    program = Runtime.get().load_program(pte, trust_native_code=True)
    for name, module in modules.items():
        [got] = program.load_method(name).execute([x])
        with torch.no_grad():
            torch.testing.assert_close(got, module(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "specs, kwargs, message",
    [
        ([("share_weights", b"1")], {"runtime": "upstream"}, "runtime 'upstream'"),
        ([("share_weights", b"1")], {"target": "mps_emulated"}, "target 'mps_emulated'"),
        ([("share_weights", b"0"), ("share_mutable_buffers", b"1")], {}, "share_weights is 0"),
        ([("share_mutable_buffers", b"1")], {"runtime": "upstream"}, "runtime 'upstream'"),
        ([("share_weights", b"yes")], {}, "must be b'1' or b'0'"),
    ],
)
def test_sharing_that_cannot_be_honoured_is_refused_by_the_partitioner(specs, kwargs, message):
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    compile_specs = [CompileSpec(k, v) for k, v in specs]
    with pytest.raises(ValueError, match=message):
        MetalPartitioner(compile_specs, **{"target": "host", **kwargs})
