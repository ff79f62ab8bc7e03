"""``ShimContext``: shims state is one object; two contexts in one process do not interact.

Independence is checked through the C entry points (the trampoline of each context),
against what the other context reports, and against eager PyTorch for model runs.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import etmetal.shims
from etmetal.backend.aoti_compile import compile_exported_program
from etmetal.examples.strided_views import CASES_BY_NAME, exported
from etmetal.shims import (
    AotiModel,
    AotiModelError,
    BridgeError,
    Device,
    HostAllocator,
    ShimContext,
    c_api,
    default_context,
    standard_context,
    standard_shims,
)
from etmetal.shims.abi_codes import DEVICE_CODES

SHIMS_DIR = Path(etmetal.shims.__file__).parent
MODULES = sorted(p.stem for p in SHIMS_DIR.glob("*.py") if p.stem != "__init__")
# every module of the package, its subpackages' too (``metal.msl``)
ALL_MODULES = sorted(
    ".".join(p.relative_to(SHIMS_DIR).with_suffix("").parts).removesuffix(".__init__")
    for p in SHIMS_DIR.rglob("*.py")
    if p.name != "__init__.py" or p.parent != SHIMS_DIR
)
FLOAT32 = 6
XPU = DEVICE_CODES["xpu"]  # a device no context has built in


# One interpreter imports torch, then forks a child per module, which imports that module
# first: no etmetal module is loaded in any child before its own. A fresh interpreter per
# module spent ~3 s of its ~3 s importing torch, which each module's chain loads anyway.
_FRESH_IMPORTS = r"""
import json, os, sys, traceback
import torch
assert not [m for m in sys.modules if m.split(".")[0] == "etmetal"]
results = {}
for name in sys.argv[2:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            __import__(name)
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        error = f.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    results[name] = {"exit_code": code, "error": error}
with open(sys.argv[1], "w") as f:
    json.dump(results, f)
"""


@pytest.fixture(scope="module")
def fresh_imports(tmp_path_factory) -> dict[str, dict]:
    """Each shims module (and a package with an import cycle, to show one is caught)
    imported first in a process of its own: module name -> exit code and traceback."""
    tmp = tmp_path_factory.mktemp("imports")
    cycle = tmp / "cyclic"
    cycle.mkdir()
    (cycle / "__init__.py").write_text("")
    (cycle / "a.py").write_text("from cyclic.b import B\nA = 1\n")
    (cycle / "b.py").write_text("from cyclic.a import A\nB = 2\n")
    names = [f"etmetal.shims.{m}" for m in ALL_MODULES] + ["cyclic.a"]
    out = tmp / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH_IMPORTS, str(out), *names],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("module", ALL_MODULES)
def test_each_shims_module_imports_alone(module, fresh_imports):
    """A fresh process imports the module first: no import cycle can leave it half-made."""
    result = fresh_imports[f"etmetal.shims.{module}"]
    assert result["exit_code"] == 0, result["error"][-2000:]


def test_the_fresh_import_check_catches_an_import_cycle(fresh_imports):
    result = fresh_imports["cyclic.a"]
    assert result["exit_code"] == 1 and "partially initialized module" in result["error"]


def _local_imports(path: Path) -> set[str]:
    """The shims modules ``path`` imports, at module level or inside functions (imports
    under ``if TYPE_CHECKING:`` never run and are left out)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found & set(MODULES)


def test_shims_modules_import_each_other_without_cycles():
    graph = {m: _local_imports(SHIMS_DIR / f"{m}.py") for m in MODULES}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join((*path, m))}"
        if m in done:
            return
        for dep in graph[m]:
            visit(dep, (*path, m))
        done.add(m)

    for m in MODULES:
        visit(m, ())


def _empty(lib, sizes, device_type: int = 0) -> tuple[int, int]:
    arr = (ctypes.c_int64 * len(sizes))(*sizes)
    h = ctypes.c_void_p()
    rc = lib.aoti_torch_empty_strided(
        len(sizes), arr, None, FLOAT32, device_type, 0, ctypes.byref(h)
    )
    return rc, h.value


@pytest.fixture(scope="module")
def other() -> ShimContext:
    ctx = standard_context()
    ctx.load_bridge()
    return ctx


def test_two_contexts_have_their_own_handles_and_errors(other):
    main = default_context()
    lib_main, lib_other = c_api(), c_api(other)
    before_main, before_other = main.memory_stats(), other.memory_stats()
    assert other.load_bridge().path != main.load_bridge().path  # a trampoline of its own

    rc, h = _empty(lib_other, (3, 5))
    assert rc == 0, other.last_error()
    assert other.memory_stats().tensors == before_other.tensors + 1
    assert main.memory_stats() == before_main  # nothing appeared in the default context

    main.clear_last_error()
    dim = ctypes.c_int64()
    # the handle means nothing to the default context: an error there, not a tensor
    assert lib_main.aoti_torch_get_dim(h, ctypes.byref(dim)) == 1
    assert "not a live tensor" in main.last_error()
    assert lib_other.aoti_torch_get_dim(h, ctypes.byref(dim)) == 0 and dim.value == 2

    other.clear_last_error()
    assert lib_main.aoti_torch_delete_tensor_object(h) == 1  # not the default context's
    assert "not a live tensor" in main.last_error()
    assert other.last_error() == ""  # one context's failure is not the other's error
    assert lib_other.aoti_torch_delete_tensor_object(h) == 0
    assert other.memory_stats().live() == before_other.live()
    assert main.memory_stats().live() == before_main.live()


class FillingAllocator(HostAllocator):
    """Host memory that pretends to be another device's (as an emulated device's would)."""

    def __init__(self, device_type: int) -> None:
        super().__init__()
        self.device_type = device_type
        self.fill_byte = 0x7F
        self.allocations = 0

    def allocate(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        return super().allocate(nbytes)


def test_a_device_registered_on_one_context_is_not_on_the_other():
    ctx = standard_context()
    seen = []

    def xpu_dtype_size(ctx_arg, dtype):  # a device-only shim, reached with its context
        seen.append(ctx_arg)
        return 123

    allocator = ctx.register_device(
        Device(
            "xpu",
            XPU,
            lambda: FillingAllocator(XPU),
            shims={"aoti_torch_dtype_element_size": xpu_dtype_size},
        )
    )
    lib = c_api(ctx)
    rc, h = _empty(lib, (4,), device_type=XPU)
    assert rc == 0, ctx.last_error()
    assert allocator.allocations == 1
    device = ctypes.c_int32()
    assert lib.aoti_torch_get_device_type(h, ctypes.byref(device)) == 0 and device.value == XPU
    assert ctx.lookup(h).torch().view(torch.uint8).eq(0x7F).all()  # its allocator's memory
    assert lib.aoti_torch_delete_tensor_object(h) == 0
    assert lib.aoti_torch_dtype_element_size(FLOAT32) == 123 and seen == [ctx]

    assert XPU in standard_context(devices=[ctx.devices["xpu"]]).allocators

    main = default_context()
    main.clear_last_error()
    rc, _ = _empty(c_api(), (4,), device_type=XPU)
    assert rc == 1 and "no allocator" in main.last_error()
    assert c_api().aoti_torch_dtype_element_size(FLOAT32) == 4  # the default shim there


def test_the_emulated_metal_device_is_a_plug_in():
    """A context has the emulated Metal device only once it is registered on it: without it
    no mps storage, no mps shims and none of its native code; ``register`` brings all three
    (and refuses once the trampoline is built without its code)."""
    from etmetal.shims.emulated_mps import mps_device, plugin

    bare = ShimContext(shims=standard_shims())
    assert not [n for n in bare.shims if n.startswith("aoti_torch_mps_malloc")]
    rc, _ = _empty(c_api(bare), (3,), device_type=mps_device.DEVICE_MPS)
    assert rc == 1 and "no allocator" in bare.last_error()
    assert "aoti_torch_mps_shared_callback" not in bare.load_bridge().exported
    with pytest.raises(BridgeError, match="native code"):
        plugin.register(bare)

    ctx = ShimContext(shims=standard_shims())
    plugin.register(ctx)
    lib = c_api(ctx)
    rc, h = _empty(lib, (3,), device_type=mps_device.DEVICE_MPS)
    assert rc == 0, ctx.last_error()
    device = ctypes.c_int32()
    assert lib.aoti_torch_get_device_type(h, ctypes.byref(device)) == 0
    assert device.value == DEVICE_CODES["mps"]
    assert mps_device.live_mps_storages(ctx) == 1
    assert lib.aoti_torch_delete_tensor_object(h) == 0
    assert mps_device.live_mps_storages(ctx) == 0
    assert "aoti_torch_mps_shared_callback" in ctx.load_bridge().exported


def test_shims_for_names_the_loaded_trampoline_lacks_are_refused(other):
    with pytest.raises(BridgeError, match="aoti_torch_not_a_shim"):
        other.register_shims({"aoti_torch_not_a_shim": lambda ctx: None})


@pytest.fixture(scope="module")
def chunk_cat(tmp_path_factory):
    """A kernel writes through two views with holes of one buffer (``chunk`` then ``cat``):
    the shared strided-view case, so its compile is the one test_models uses."""
    case = CASES_BY_NAME["chunk_cat"]
    ep = exported(case)
    torch.manual_seed(1)
    (x,) = case.make_inputs()
    art = compile_exported_program(ep)
    # a model file binds to the first context that loads it: each context here gets its own
    # copy (other modules load the cached file in theirs)
    files = []
    for name in ("main", "other"):
        files.append(tmp_path_factory.mktemp(name) / art.so_path.name)
        shutil.copy2(art.so_path, files[-1])
    return ep.module()(x).detach(), x, *files, art.weights_path.read_bytes()


def test_materialize_policy_is_per_model_and_per_context(chunk_cat, other):
    """Interleaved runs: the "view" model stays exact whatever the "upstream_copy" model (upstream's
    copying behaviour, which loses the kernel's writes) runs next to it."""
    expected, x, so_path, so_copy, weights = chunk_cat
    main = default_context()
    main.host.fill_byte = 0xFF  # unwritten output elements read as NaN
    other.host.fill_byte = 0xFF
    try:
        with (
            AotiModel(so_path, weights) as view_model,
            AotiModel(so_copy, weights, materialize="upstream_copy", context=other) as copy_model,
        ):
            for _ in range(3):  # first run, then steady runs
                torch.testing.assert_close(view_model.run([x])[0], expected)
                lost = copy_model.run([x])[0]
                assert torch.isnan(lost).all()  # the cat wrote into copies only
                assert main.materialize == "view" and other.materialize == "view"
        assert main.memory_stats().live() == (0, 0, 0)
        assert other.memory_stats().live() == (0, 0, 0)
    finally:
        main.host.fill_byte = None
        other.host.fill_byte = None


def test_upstream_copy_and_view_models_share_a_context_without_sharing_policy(chunk_cat):
    """Each model's runs follow its own policy, whatever the context's default (for calls
    outside runs) says, and no run writes a context-wide policy."""
    expected, x, so_path, _, weights = chunk_cat
    ctx = default_context()
    writes = []

    class Spy(type(ctx)):
        def __setattr__(self, name, value):
            if name == "materialize":
                writes.append(value)
            super().__setattr__(name, value)

    ctx.host.fill_byte = 0xFF
    ctx.__class__ = Spy
    try:
        for default in ("upstream_copy", "view"):
            ctx.set_materialize(default)
            writes.clear()
            with (
                AotiModel(so_path, weights, materialize="upstream_copy") as copy_model,
                AotiModel(so_path, weights) as view_model,
            ):
                for _ in range(3):  # first run, then steady runs
                    assert torch.isnan(copy_model.run([x])[0]).all()
                    torch.testing.assert_close(view_model.run([x])[0], expected)
                    assert ctx.running is None
            assert writes == []
            assert ctx.materialize == default
    finally:
        ctx.__class__ = ShimContext
        ctx.set_materialize("view")
        ctx.host.fill_byte = None


def test_a_run_inside_another_run_of_the_context_is_refused(chunk_cat):
    expected, x, so_path, _, weights = chunk_cat
    ctx = default_context()
    with AotiModel(so_path, weights) as model:
        # as if a shim callback of another model's run in progress had started this run
        ctx.running = SimpleNamespace(so_path=Path("outer.so"), materialize="view")
        try:
            with pytest.raises(AotiModelError, match="inside the run of outer.so"):
                model.run([x])
        finally:
            ctx.running = None
        torch.testing.assert_close(model.run([x])[0], expected)


def test_closing_the_last_model_of_one_context_keeps_the_other_contexts_cache(chunk_cat, other):
    expected, x, so_path, so_copy, weights = chunk_cat
    main = default_context()
    with AotiModel(so_path, weights) as keep:
        with AotiModel(so_copy, weights, context=other) as closing:
            torch.testing.assert_close(closing.run([x])[0], expected)
        assert other.open_models == 0
        assert main.open_models == 1  # a process-wide counter would have reached zero
        for _ in range(3):
            torch.testing.assert_close(keep.run([x])[0], expected)
        assert main.native.counter("cached") > 0  # still caching for the open model


def test_a_model_file_another_context_loaded_is_refused_with_a_clear_error(chunk_cat, other):
    """The dynamic loader binds a ``.so`` file once: to the context that loaded it first."""
    expected, x, so_path, _, weights = chunk_cat
    with AotiModel(so_path, weights) as first:
        torch.testing.assert_close(first.run([x])[0], expected)
        with pytest.raises(BridgeError, match="another ShimContext"):
            AotiModel(so_path, weights, context=other)
    assert other.memory_stats().live() == (0, 0, 0)
    assert default_context().memory_stats().live() == (0, 0, 0)


def _module_state() -> dict[tuple[str, str], tuple[int, str]]:
    """Every module-level binding of etmetal.shims.*: the object's identity, and the
    contents of containers and plain instances (a table or flag object changed by use would
    show). The default context (and its host allocator) is the one allowed exception."""
    allowed = (default_context(), default_context().host)
    state = {}
    for name, module in sorted(sys.modules.items()):
        if name != "etmetal.shims" and not name.startswith("etmetal.shims."):
            continue
        for attr, value in vars(module).items():
            if isinstance(value, (dict, list, set, bytearray)):
                shown = repr(value)
            elif (
                type(value).__module__.startswith("etmetal.")  # an object of the project's
                and hasattr(value, "__dict__")
                and not any(value is a for a in allowed)
            ):
                shown = repr(vars(value))
            else:
                shown = ""
            state[(name, attr)] = (id(value), shown)
    return state


def test_using_the_shims_changes_no_module_level_state(chunk_cat, other):
    """Handles, storages, errors, allocations, model runs and copies all land in contexts:
    no module global is rebound and no module-level table changes."""
    from etmetal.runtime.kernels.strided_copy import strided_copy

    expected, x, so_path, so_copy, weights = chunk_cat
    before = _module_state()
    kept = []
    for ctx in (default_context(), other):
        lib = c_api(ctx)
        kept.append((lib, _empty(lib, (2,) * 9)[1]))  # alive at the second look: Python's table
        rc, h = _empty(lib, (4, 6))
        assert rc == 0, ctx.last_error()
        sizes = ctypes.c_void_p()
        assert lib.aoti_torch_get_sizes(h, ctypes.byref(sizes)) == 0
        assert ctx.lookup(h).sizes == (4, 6)  # adopts a native tensor into Python
        assert lib.aoti_torch_cpu_mm_out(h, h, h) == 1  # a failure records an error
        assert lib.aoti_torch_delete_tensor_object(h) == 0
        ctx.host.fill_byte = 0xFF
        ctx.host.fill_byte = None
    with AotiModel(so_path, weights, materialize="upstream_copy") as copy_model:
        copy_model.run([x])
    with AotiModel(so_copy, weights, context=other) as model:
        torch.testing.assert_close(model.run([x])[0], expected)
    src = torch.randn(3, 5).t()
    dst = torch.empty(5, 3)
    strided_copy(dst, src)
    after = _module_state()
    for lib, h in kept:
        assert lib.aoti_torch_delete_tensor_object(h) == 0
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"module-level state changed: {changed}"


def test_exit_hook_closes_open_models_then_releases_succeed_in_c(chunk_cat, tmp_path):
    """At exit the context's open models are deleted while the shims still reach Python;
    after that, a release the trampoline cannot forward succeeds (AOTI throws on a failed
    delete in a destructor) and any other unbound shim still fails."""
    import weakref

    from etmetal.shims.bridge import _unbind_at_exit

    expected, x, so_path, _, weights = chunk_cat
    ctx = standard_context()
    own = tmp_path / so_path.name  # a model file binds to the first context loading it
    shutil.copy2(so_path, own)
    model = AotiModel(own, weights, context=ctx)  # left open, as by a user's script
    torch.testing.assert_close(model.run([x])[0], expected)
    assert ctx.open_models == 1
    lib = c_api(ctx)
    assert lib.aoti_torch_delete_tensor_object(None) == 1  # bound: NULL is no tensor

    _unbind_at_exit(weakref.ref(ctx.load_bridge()))
    assert ctx.open_models == 0
    assert ctx.memory_stats().live() == (0, 0, 0)  # the container's tensors were deleted
    with pytest.raises(RuntimeError, match="closed"):
        model.run([x])
    errors = ctx.errors
    assert lib.aoti_torch_delete_tensor_object(None) == 0  # unbound release: success
    assert lib.aoti_torch_get_dim(None, ctypes.byref(ctypes.c_int64())) == 1  # still fails
    assert ctx.errors == errors  # neither reached Python
