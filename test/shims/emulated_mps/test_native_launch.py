"""The emulated Metal device's launch ABI served in C (``mps_encoder.cpp``, ``mps_buffers.cpp``)
against the Python shims, the reference: the same outputs bit for bit, eager's values, no
Python call from a steady launch, and the same error for every hostile call."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.examples import metal_registry
from etmetal.examples.demo import DEMO_MODELS, get_demo
from etmetal.shims import AotiModel, default_context, memory_stats
from etmetal.shims.emulated_mps import mps_device
from etmetal.testing.mps_hostile import CASES
from etmetal.testing.shim_counts import steady_runs

# the launch path and the raw buffers: what mps_encoder.cpp / mps_buffers.cpp serve
LAUNCH_SHIMS = {
    "aoti_torch_mps_run_command_block",
    "aoti_torch_mps_start_encoding",
    "aoti_torch_mps_set_arg_tensor",
    "aoti_torch_mps_set_arg_int",
    "aoti_torch_mps_dispatch_single",
    "aoti_torch_mps_dispatch_single_with_group_size",
    "aoti_torch_mps_dispatch_array",
    "aoti_torch_mps_dispatch_array_with_group_size",
    "aoti_torch_mps_malloc",
    "aoti_torch_mps_free",
    "aoti_torch_mps_memcpy",
    "aoti_torch_mps_copy_buffer",
}
REGISTRY_SAMPLE = ("add", "split_cat", "narrow_last_dim", "sdpa_add")


def _steady(so, weights, inputs, shims: str, runs: int = 3):
    """Outputs of the first and last runs, and per-shim counts of ``runs`` runs after the first."""
    with AotiModel(so, weights, device="mps", shims=shims) as model:
        return steady_runs(model, inputs, runs)


def _cases():
    """(name, make, atol, rtol): the tolerances against eager are the examples' own."""
    demos = [(d.name, lambda n=d.name: get_demo(n), d.atol, d.rtol) for d in DEMO_MODELS]
    registry = [
        (
            f"registry:{n}",
            lambda n=n: metal_registry.get_model_and_inputs(n),
            metal_registry.REGISTRY[n].atol,
            metal_registry.REGISTRY[n].rtol,
        )
        for n in REGISTRY_SAMPLE
    ]
    return demos + registry


@pytest.mark.parametrize("name, make, atol, rtol", _cases(), ids=[c[0] for c in _cases()])
def test_steady_launches_make_no_python_call_and_match_the_python_shims(name, make, atol, rtol):
    module, inputs = make()
    module = module.eval()
    inputs = tuple(inputs)
    with torch.no_grad():
        ep = torch.export.export(module, inputs)
        want = module(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    art = compile_exported_program(ep, target="mps_emulated")
    weights = art.weights_bytes()
    ctx = default_context()
    start = mps_device.live_mps_storages(ctx)
    native_first, native_last, native = _steady(art.so_path, weights, inputs, "native")
    python_first, python_last, python = _steady(art.so_path, weights, inputs, "python")
    launches = {n: c for n, c in native.items() if n in LAUNCH_SHIMS}
    assert launches, f"{name}: no Metal kernel was launched"
    assert all(p == 0 for _, p in launches.values()), launches
    # the reference really ran in Python: none of its launches was served in C
    ref = {n: c for n, c in python.items() if n in LAUNCH_SHIMS}
    assert ref and all(c == 0 for c, _ in ref.values()), ref
    assert {n: sum(c) for n, c in launches.items()} == {n: sum(c) for n, c in ref.items()}
    for got, ref_out, w in zip(native_first + native_last, python_first + python_last, want * 2):
        assert torch.equal(got, ref_out), name  # bit for bit
        torch.testing.assert_close(got, w, atol=atol, rtol=rtol)
    assert mps_device.live_mps_storages(ctx) == start


def _run_cases(cases: list[str], shims: str) -> dict[str, dict]:
    """Each case's return code, error and shim counts (of that case alone), all run in one
    fresh process on implementation ``shims``, in order."""
    code = (
        "import json, sys\n"
        "from etmetal.shims import default_context\n"
        "from etmetal.testing import mps_hostile as h\n"
        f"default_context().set_implementation({shims!r})\n"
        "bridge = default_context().load_bridge()\n"
        f"for case in {cases!r}:\n"
        "    before = bridge.shim_counts()\n"
        "    rc, err = h.run_case(case)\n"
        "    after = bridge.shim_counts()\n"
        "    deltas = {n: [a - b for a, b in zip(c, before.get(n, (0, 0)))] for n, c in after.items()}\n"
        "    counts = {n: d for n, d in deltas.items() if any(d)}\n"
        "    print(json.dumps({'case': case, 'rc': rc, 'error': err, 'counts': counts}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cases} ({shims}): exit {proc.returncode}\n{proc.stderr[-2000:]}"
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in results] == cases, proc.stdout[-2000:]
    return {r.pop("case"): r for r in results}


@pytest.fixture(scope="module")
def hostile_results() -> dict[str, dict[str, dict]]:
    """implementation -> case -> result: one process per implementation runs every case
    (a fresh interpreter per case would pay its imports 24 times)."""
    cases = sorted(CASES_COMPARED)
    return {shims: _run_cases(cases, shims) for shims in ("native", "python")}


def _addresses_out(message: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x?", message)  # handles and buffers move between processes


# the cases whose failing call is one the C launch path serves
NATIVE_CASES = sorted(c for c in CASES if not c.startswith(("include_", "memcpy_", "copy_")))
COPY_CASES = sorted(c for c in CASES if c.startswith(("memcpy_", "copy_")))
CASES_COMPARED = NATIVE_CASES + COPY_CASES


@pytest.mark.parametrize("case", NATIVE_CASES)
def test_a_hostile_launch_gives_the_same_error_in_c_and_in_python(case, hostile_results):
    native, python = hostile_results["native"][case], hostile_results["python"][case]
    assert native["rc"] == python["rc"] == 1, (native, python)
    assert _addresses_out(native["error"]) == _addresses_out(python["error"])
    served = {n: c for n, c in native["counts"].items() if n in LAUNCH_SHIMS}
    assert served and all(p == 0 for _, p in served.values()), served
    assert all(c == 0 for n, (c, _) in python["counts"].items() if n in LAUNCH_SHIMS)


@pytest.mark.parametrize("case", COPY_CASES)
def test_a_hostile_copy_gives_the_same_error_in_c_and_in_python(case, hostile_results):
    native, python = hostile_results["native"][case], hostile_results["python"][case]
    assert native["rc"] == python["rc"] == 1, (native, python)
    assert _addresses_out(native["error"]) == _addresses_out(python["error"])


def test_the_checker_and_the_python_implementation_launch_through_python():
    """A checked dispatch needs the checked build (Python's); the python implementation is
    the reference: neither may be served by the C path."""
    from etmetal.shims.emulated_mps import native_launch
    from etmetal.testing import mps_hostile as h

    ctx = default_context()
    lib = h._lib()
    # one kernel and one output tensor, deleted at the end: this runs in the suite's process,
    # so it must leave no shim tensor behind for later tests' memory checks
    live = memory_stats().live()
    library_handle, fn = _fill_function(lib, h)
    out = h.mps_tensor(lib, 1 << 16)

    def launch_counts() -> tuple[int, int]:
        c = ctx.load_bridge().shim_counts().get("aoti_torch_mps_dispatch_single", (0, 0))
        lib.aoti_torch_mps_start_encoding(fn)
        lib.aoti_torch_mps_set_arg_tensor(fn, 0, out)
        lib.aoti_torch_mps_set_arg_int(fn, 1, 0)
        assert lib.aoti_torch_mps_dispatch_single(fn, 16) == 0, h._error()
        after = ctx.load_bridge().shim_counts()["aoti_torch_mps_dispatch_single"]
        return after[0] - c[0], after[1] - c[1]

    try:
        _launch_through_each_implementation(ctx, native_launch, launch_counts)
    finally:
        lib.aoti_torch_delete_tensor_object(out)
        lib.aoti_torch_mps_delete_shader_library(library_handle)
    assert memory_stats().live() == live


def _fill_function(lib, h) -> tuple[int, int]:
    rc, library_handle = h.library(lib, h.KERNELS)
    assert rc == 0, h._error()
    return library_handle, h.function(lib, library_handle, b"fill")


def _launch_through_each_implementation(ctx, native_launch, launch_counts) -> None:
    before = native_launch.dispatches(ctx)
    assert launch_counts() == (1, 0)
    previous = mps_device.set_metal_check(ctx, "memcheck")
    try:
        assert launch_counts() == (0, 1)
    finally:
        mps_device.set_metal_check(ctx, previous)
    was = ctx.set_implementation("python")
    try:
        assert launch_counts() == (0, 1)
    finally:
        ctx.set_implementation(was)
    assert launch_counts() == (1, 0)
    assert native_launch.dispatches(ctx) == before + 4
