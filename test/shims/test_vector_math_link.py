"""A host ``.so`` that calls SLEEF vector math loads through the model's link group.

Whether Inductor's CPU kernels call SLEEF depends on its cache state (see
``src/etmetal/shims/model.py``), so the suite cannot rely on a compiled model to exercise this path.
``native/sleef_exp.c`` calls SLEEF's vector exp and leaves it undefined, as such a
``.so`` does; it is linked into the same group a model gets and its results are checked
against ``torch.exp``.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest
import torch

from etmetal.shims import load_bridge
from etmetal.shims.model_link import compiler, link_wrapper, undefined_symbols
from etmetal.shims.model_symbols import model_link_group

SOURCE = Path(__file__).parent / "native" / "sleef_exp.c"


@pytest.fixture(scope="module")
def sleef_so(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sleef") / "sleef_exp.so"
    cc = compiler("c")
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(SOURCE)],
        check=True,
    )
    return out


def test_sleef_caller_loads_through_the_link_group_and_computes_exp(sleef_so):
    sleef = undefined_symbols(sleef_so, "Sleef_")
    assert sleef and all(name.startswith("Sleef_expf") for name in sleef)
    group = model_link_group(load_bridge().path, sleef_so)
    assert group[0] == load_bridge().path and group[-1] == sleef_so
    assert any(p.name == "libtorch_cpu.so" for p in group[1:-1])
    lib = ctypes.CDLL(str(link_wrapper(group)), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    fn = lib.etm_sleef_exp
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = ctypes.c_int32
    x = torch.linspace(-30.0, 30.0, 1024)
    x[:8] = torch.tensor([0.0, -0.0, 1.0, -1.0, 88.0, -87.0, 1e-7, 0.5])
    out = torch.full_like(x, float("nan"))
    assert fn(x.data_ptr(), out.data_ptr(), x.numel()) == 0
    # SLEEF's _u10 functions are within 1.0 ULP; torch's exp is too
    torch.testing.assert_close(out, torch.exp(x), rtol=2.5e-7, atol=0.0)


def test_without_the_vector_math_library_the_same_object_does_not_load(sleef_so, tmp_path):
    # the group without libtorch_cpu: SLEEF is not in the process-wide scope either,
    # so the library named by the group is what makes the load work (a copy: the
    # loader would reuse an already-loaded file)
    copy = tmp_path / "sleef_exp_copy.so"
    copy.write_bytes(sleef_so.read_bytes())
    bare = link_wrapper([load_bridge().path, copy])
    with pytest.raises(OSError, match="Sleef_expf"):
        ctypes.CDLL(str(bare), mode=os.RTLD_NOW | os.RTLD_LOCAL)
