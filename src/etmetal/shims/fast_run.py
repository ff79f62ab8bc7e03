"""A model's steady-state run as one CPython call (``fast_run.c``).

``steady_run.SteadyRun`` already runs a model in one call into C (``etm_run``), but the
Python around that call (reading each input's geometry, making the outputs, the run lock,
the runner's layers) costs more than a small model's whole run. ``FastRun`` does those
steps in C over the same prepared ``etm_call``, and declines, by calling the Python path
it stands in front of with the same arguments, whenever a run is not the ordinary one
(see the C file's header). ``AotiModel`` installs one as its ``run`` attribute; a
``.pte`` method that is one delegate call gets one as its ``execute``
(``runtime/direct_delegate.py``), which also checks the caller's inputs and the outputs
against the planned layouts. A model of the emulated Metal device gets one too: its inputs
are lent as device-13 records, and C reads the device's launch-failure record around the
run (``unchecked``), so a failure is raised by Python with the general path's message. The Python path stays the reference: it runs the first run,
every declined one, and finishes a run that came back unusual (``finish``).

Nothing is compiled against libtorch or torch's headers: the libtorch functions are the
exported C shims (``aoti_torch_get_*``, ``aoti_torch_empty_strided``) and
``THPVariable_Wrap``, taken from the libraries torch has loaded. The one layout fact it
relies on (a tensor object holds its ``at::Tensor`` right after the object header) is
checked on a probe tensor before the first ``FastRun`` is built; if it does not hold,
nothing is built and every run takes the Python path. ``ETMETAL_FAST_RUN=0`` does the same.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import os
import sysconfig
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .abi_codes import ITEMSIZE, TORCH_TO_DTYPE
from .model_link import WARNINGS, NativeBuildError, build_files
from .native_fallbacks import libtorch_cpu
from .native_tensors import HEADER, MAX_DIMS, NDTYPES
from .steady_run import COPY_LIMIT

SOURCE = Path(__file__).with_name("fast_run.c")
# the extension's units (the call, its construction and module, the tensors it reads and
# makes) and the headers they include
UNITS = (SOURCE, SOURCE.with_name("fast_run_type.c"), SOURCE.with_name("fast_run_tensors.c"))
HEADERS = (SOURCE.with_name("fast_run.h"), SOURCE.with_name("fast_run_tensors.h"), HEADER)
ENV = "ETMETAL_FAST_RUN"  # "0": never build one (every run takes the Python path)
MODULE = "etmetal_fast_run"

# the C side's function table, in its order (enum F_* of fast_run.c)
_LIBTORCH_CPU = (
    "aoti_torch_get_data_ptr",
    "aoti_torch_get_sizes",
    "aoti_torch_get_strides",
    "aoti_torch_get_dtype",
    "aoti_torch_get_dim",
    "aoti_torch_get_storage_offset",
    "aoti_torch_get_storage_size",
    "aoti_torch_get_device_type",
    "aoti_torch_get_layout",
    "aoti_torch_empty_strided",
    "aoti_torch_delete_tensor_object",
)
_WRAP = "_Z16THPVariable_WrapRKN2at10TensorBaseE"  # THPVariable_Wrap(const at::TensorBase&)


def python_include() -> str:
    """The folder of ``Python.h`` of this interpreter (the extension's one include)."""
    return sysconfig.get_paths()["include"]


def _build() -> Path:
    files = {p.name: p.read_bytes() for p in (*UNITS, *HEADERS)}
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    flags = ("-O2", "-std=c11", f"-I{python_include()}", *WARNINGS)
    return build_files("fast_run", MODULE + suffix, files, [p.name for p in UNITS], flags=flags)


def _libtorch_python() -> ctypes.CDLL:
    path = Path(torch.__file__).parent / "lib" / "libtorch_python.so"
    return ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


@functools.cache
def _native() -> tuple[Any, tuple[int, ...], bytes] | None:
    """(the module, the function table, the itemsize table), or None when unusable."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        path = _build()
        loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
        spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        cpu, python = libtorch_cpu(), _libtorch_python()
        fns = (*(_address(cpu, n) for n in _LIBTORCH_CPU), _address(python, _WRAP))
    except (NativeBuildError, OSError, AttributeError, ImportError):
        return None
    # the layout fact the C side relies on, checked on tensors of two kinds
    for probe in (torch.arange(6.0)[2:], torch.zeros(3, dtype=torch.int64)):
        if module.probe_data_ptr(probe, fns[0]) != probe.data_ptr():
            return None
    sizes = bytearray(NDTYPES)
    for code in TORCH_TO_DTYPE.values():
        if 0 <= code < NDTYPES:
            sizes[code] = max(1, ITEMSIZE[code])
    return module, fns, bytes(sizes)


def expected(tensors: Sequence[Any] | None, count: int) -> tuple | None | bool:
    """``tensors`` as the tuple a ``FastRun`` checks layouts against (None: no check), or
    False when one is not a tensor the C side reads (the caller then builds no fast run).
    The C side reads each tensor's layout at every call, as it is then: a planned tensor a
    dynamic shape resized is compared as resized, as the Python path compares it."""
    if tensors is None:
        return None
    held = tuple(tensors)
    if len(held) != count:
        return False
    for t in held:
        if type(t) is not torch.Tensor or t.dim() > MAX_DIMS or t.dtype not in TORCH_TO_DTYPE:
            return False
    return held


def build(
    steady: Any,
    model: Any,
    *,
    fallback: Callable[..., Any],
    finish: Callable[[Sequence[Any], int, list], list],
    expect_in: Sequence[torch.Tensor] | None = None,
    expect_out: Sequence[torch.Tensor] | None = None,
    guard: Any = None,
    guard_owner: Any = None,
    unchecked: tuple | None = None,
) -> Any:
    """A ``FastRun`` over ``steady`` (a ``SteadyRun``) of ``model``, or None when the native
    module is unusable. ``fallback`` takes any call it declines; ``finish`` completes a run
    that came back unusual; ``expect_in``/``expect_out``: tensors whose layouts the inputs
    and outputs must have, or the call is declined; ``guard``/``guard_owner``: a lock to
    hold and an object whose ``_owner`` names the running thread meanwhile (a ``Method``'s);
    ``unchecked``: a device model's ``ShimContext.unchecked_holders()``, whose launch-failure
    records C reads before and after each run (the inputs are lent as ``steady``'s device)."""
    native = _native()
    if native is None:
        return None
    checks = [expected(expect_in, steady.n_in), expected(expect_out, steady.n_out)]
    if any(c is False for c in checks):
        return None  # a layout C cannot describe: the Python path serves every call
    module, fns, sizes = native
    ctx = steady.ctx
    return module.FastRun(
        ctypes.addressof(steady.call),
        ctypes.cast(ctx.native.run, ctypes.c_void_p).value,
        ctypes.addressof(steady.armed),
        fns,
        sizes,
        torch.Tensor,
        ctx,
        ctx.run_lock,
        weakref.ref(model),
        fallback,
        finish,
        steady,
        COPY_LIMIT,
        *checks,
        guard,
        None if guard_owner is None else weakref.ref(guard_owner),
        unchecked,
        steady.device_type,
    )


def install(
    model: Any, runner: Any, method: Callable[..., Any], unchecked: tuple | None = None
) -> None:
    """Let a ``FastRun`` of ``runner``'s steady run serve ``model.run`` (``method``, the
    general run, is the fallback); nothing when the model has no steady run. It is kept as
    ``model._fast_call`` and called from the class's ``run``, so a call on a temporary
    model (``AotiModel(...).run(x)``) keeps the model alive while the run holds it weakly."""
    if runner.steady is None:
        return
    fast = build(
        runner.steady,
        model,
        fallback=functools.partial(_call_by_ref, weakref.ref(model), method),
        finish=runner.finish_fast,
        unchecked=unchecked,
    )
    if fast is not None:
        model._fast_call = fast


def _call_by_ref(ref: weakref.ref, method: Callable[..., Any], *args, **kwargs) -> Any:
    """``method`` of the object ``ref`` names: a ``FastRun``'s fallback holds its model
    weakly, so dropping the model still closes it at once."""
    target = ref()
    if target is None:
        raise ReferenceError("the model of this run was garbage collected")
    return method(target, *args, **kwargs)
