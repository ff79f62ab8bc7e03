"""The differential test over the suite's model set: every model's ``.so`` on the native
shims and on the Python reference, outputs compared bit for bit and the sequence of shim
calls (names and returned error codes) compared call for call (``testing.differential``
states the one mapping between the two sequences).

The model set: the 28 Metal registry modules, the demo models, the strided-view models,
a sample of the view_copy layout cases, the small-config Hugging Face models, the two-method
LM (prefill and decode) and the extern-node (proxy executor) programs, on ``host`` and on
``mps_emulated``. They are lowered or compiled the way the suite's other tests do, so their
AOTI artifacts come from the shared content-addressed cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.backend.lowering import lower
from etmetal.examples import strided_views, view_copy
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.examples.metal_registry import REGISTRY, get_model_and_inputs
from etmetal.shims import memory_stats
from etmetal.shims.emulated_mps import mps_device
from etmetal.shims.standard_context import default_context
from etmetal.testing import proxy_models
from etmetal.testing.differential import (
    DifferentialMismatch,
    aoti_workload,
    differential,
    pte_workload,
)

TARGETS = ("host", "mps_emulated")
# view_copy cases no other test compiles for Metal: a non-packed slice and a channels-last
# 3-D input (each is a cold compile per target, ~40-60 s: a sample, not all nine)
VIEW_COPY_SAMPLE = ("sliced", "channels_last_3d")


@pytest.fixture
def no_leaks():
    yield
    stats = memory_stats()
    assert (stats.tensors, stats.storages, stats.bytes) == (0, 0, 0), stats
    assert mps_device.live_mps_storages(default_context()) == 0


def _fresh_like(inputs, seed: int) -> tuple[torch.Tensor, ...]:
    """New values with each floating input's shape and layout; other inputs kept."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if not x.is_floating_point():
            out.append(x)
            continue
        y = torch.randn(x.shape, generator=gen, dtype=x.dtype)
        channels_last = x.dim() == 4 and not x.is_contiguous()
        out.append(y.to(memory_format=torch.channels_last) if channels_last else y)
    return tuple(out)


def _three_runs(inputs) -> list[tuple[torch.Tensor, ...]]:
    # the first run, a steady run on new values, a steady run on the first values again
    return [tuple(inputs), _fresh_like(inputs, 1), tuple(inputs)]


def _forward(pte: bytes, inputs):
    runs = _three_runs(inputs)
    return pte_workload(pte, [("forward", r) for r in runs]), runs


def _check(work, runs) -> None:
    report = differential(work, lent=sum(len(r) for r in runs))
    assert report.calls > 0


def _close_to_eager(module, inputs, got, atol, rtol) -> None:
    with torch.no_grad():
        want = module(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_module_is_the_same_on_both_implementations(name, target, no_leaks):
    entry = REGISTRY[name]
    module, inputs = get_model_and_inputs(name)
    program, _ = lower(module.eval(), inputs, target=target)
    work, runs = _forward(program.buffer, inputs)
    report = differential(work, lent=sum(len(r) for r in runs))
    _close_to_eager(module, inputs, report.native.outputs[0], entry.atol, entry.rtol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("demo", DEMO_MODELS, ids=lambda d: d.name)
def test_demo_model_is_the_same_on_both_implementations(demo, target, no_leaks):
    module, inputs = get_demo(demo.name)
    with torch.no_grad():
        ep = torch.export.export(module.eval(), tuple(inputs))
    art = compile_exported_program(ep, target=target)
    runs = _three_runs(inputs)
    device = "mps" if target == "mps_emulated" else "cpu"
    report = differential(aoti_workload(art, runs, device=device), lent=sum(map(len, runs)))
    _close_to_eager(module, inputs, report.native.outputs[0], demo.atol, demo.rtol)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", [c.name for c in strided_views.CASES])
def test_strided_view_model_is_the_same_on_both_implementations(name, target, no_leaks):
    case = strided_views.CASES_BY_NAME[name]
    torch.manual_seed(0)
    module, inputs = case.make_module(), case.make_inputs()
    program, _ = lower(module.eval(), inputs, target=target)
    _check(*_forward(program.buffer, inputs))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", VIEW_COPY_SAMPLE)
def test_view_copy_case_is_the_same_on_both_implementations(name, target, no_leaks):
    case = view_copy.get_case(name)
    module, inputs = case.module(), case.example_inputs()
    program, partitioner = lower(module, inputs, target=target)
    assert partitioner.report.partitions  # the views run in a Metal delegate
    _check(*_forward(program.buffer, inputs))


def _hf_programs() -> list:
    from etmetal.testing import hf_models

    host = [pytest.param(n, "host", id=f"{n}-host") for n in sorted(hf_models.MODELS)]
    emulated = [
        pytest.param(n, "mps_emulated", id=f"{n}-mps_emulated")
        for n in sorted(hf_models.EAGER_ATTENTION_MODELS)
    ]
    return host + emulated


@pytest.mark.parametrize("name, target", _hf_programs())
def test_small_hf_model_is_the_same_on_both_implementations(name, target, no_leaks):
    from etmetal.testing import hf_models

    if target == "host":
        module, inputs = hf_models.build(name)
        program, _ = lower(module, inputs, target="host")
    else:  # as the delegate tests lower them for the emulated device
        module, inputs = hf_models.build_eager_attention(name)
        program, _ = lower(module, inputs, target=target, runtime="etmetal")
    runs = [inputs] * 3  # token ids (or audio) kept: the model reads them as given
    _check(pte_workload(program.buffer, [("forward", r) for r in runs]), runs)


def _lm_steps() -> list:
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])

    def next_token(step: int):
        def inputs(done):
            token = done[-1][0][..., -1, :].argmax(-1).view(1, 1)
            return [token, torch.tensor([8 + step])]

        return inputs

    return [("prefill", [prompt, torch.arange(8)]), *(("decode", next_token(s)) for s in range(4))]


@pytest.fixture(scope="module")
def mps_lm_program() -> bytes:
    from etmetal.bench.llm import PROMPT
    from etmetal.examples import llm

    model = llm.make_decoder_lm(llm.CONFIGS["tiny"])
    return llm.lower_methods(llm.lm_exports(model, prompt_len=PROMPT), target="mps_emulated").buffer


@pytest.mark.parametrize("layout", ["shared", "one_blob"])
def test_the_two_method_lm_is_the_same_on_both_implementations(layout, tiny_lm_programs, no_leaks):
    from etmetal.bench.llm import program_paths

    paths = program_paths("tiny", tiny_lm_programs)
    pte = Path(paths[layout]).read_bytes()
    report = differential(pte_workload(pte, _lm_steps()), lent=2 * 5)
    names = {c.name for c in report.native.calls}
    assert "aoti_torch_cpu_mm_out" in names or "aoti_torch_cpu_addmm_out" in names


def test_the_two_method_lm_on_the_emulated_device_is_the_same(mps_lm_program, no_leaks):
    report = differential(pte_workload(mps_lm_program, _lm_steps()), lent=2 * 5)
    assert "aoti_torch_mps_mm_out" in {c.name for c in report.native.calls}


@pytest.mark.parametrize("name", sorted(proxy_models.MODELS))
def test_extern_node_program_is_the_same_on_both_implementations(name, no_leaks):
    torch.manual_seed(0)  # as test_native_proxy compiles them (one cache entry)
    make, make_inputs = proxy_models.MODELS[name]
    module, example = make().eval(), make_inputs()
    art = compile_exported_program(torch.export.export(module, example))
    runs = _three_runs(example)
    report = differential(aoti_workload(art, runs), lent=sum(map(len, runs)))
    proxy_calls = [c for c in report.native.calls if c.name.endswith("call_function")]
    assert proxy_calls and all(c.result == 0 for c in proxy_calls)


# --- the harness itself: a difference is found and named ---------------------------------


def test_the_harness_names_a_differing_output_and_a_differing_call():
    from etmetal.testing import differential as diff
    from etmetal.testing.shim_trace import Call

    native = diff.Arm("native", [[torch.zeros(3)]], [Call("aoti_torch_empty_strided", 0)])
    python = diff.Arm(
        "python", [[torch.tensor([0.0, -0.0, 0.0])]], [Call("aoti_torch_empty_strided", 1)]
    )
    # -0.0 == 0.0 in value, not in bits
    with pytest.raises(DifferentialMismatch, match="run 0, output 0.*1 of 12 bytes differ"):
        diff.compare_outputs(native, python)
    with pytest.raises(DifferentialMismatch, match="call 0 differs.*empty_strided -> 0.*-> 1"):
        diff.compare_calls(native, python)
    # a missing call is named too
    python.calls = []
    with pytest.raises(DifferentialMismatch, match="native made 1 shim calls, Python 0"):
        diff.compare_calls(native, python)
