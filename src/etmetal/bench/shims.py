"""``etmetal bench shims``: ns per shim call and strided-gather bandwidth.

Shim calls are timed from native code, as a compiled ``.so`` makes them: a small C
driver (built here with the system compiler) calls the exported ``aoti_torch_*``
symbols in a loop through the trampoline. Whole-model numbers come from the
strided-view models compiled with AOTI for the host. The gather is the packed copy
a fallback op gets for a view with holes, compared with a contiguous copy of the
same bytes.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

_DRIVER = r"""
#include <stdint.h>
#include <time.h>
int32_t aoti_torch_get_data_ptr(void*, void**);
int32_t aoti_torch_get_sizes(void*, int64_t**);
int32_t aoti_torch_empty_strided(int64_t, const int64_t*, const int64_t*, int32_t, int32_t,
                                 int32_t, void**);
int32_t aoti_torch_delete_tensor_object(void*);
int32_t aoti_torch__reinterpret_tensor(void*, int64_t, const int64_t*, const int64_t*, int64_t,
                                       void**);
int32_t aoti_torch_dtype_float32(void);
int32_t aoti_torch_clone(void*, void**);
static double now_ns(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec;
}
/* ns per shim call for one call pattern; -1 if a call failed */
double etm_bench(int which, int n) {
  static const int64_t sizes[2] = {4, 32}, strides[2] = {32, 1};
  static const int64_t vsizes[2] = {4, 16};
  void *base = 0, *h = 0, *p = 0; int64_t* s = 0; int calls = 0;
  int32_t f32 = aoti_torch_dtype_float32();
  if (aoti_torch_empty_strided(2, sizes, strides, f32, 0, 0, &base)) return -1;
  if (which == 5) { /* a tensor Python made (a clone): its views are Python's too */
    void* native_base = base;
    if (aoti_torch_clone(native_base, &base)) return -1;
    aoti_torch_delete_tensor_object(native_base);
  }
  double t0 = now_ns();
  for (int i = 0; i < n; ++i) {
    switch (which) {
      case 0: if (aoti_torch_get_data_ptr(base, &p)) return -1; calls += 1; break;
      case 1: if (aoti_torch_get_sizes(base, &s)) return -1; calls += 1; break;
      case 2:
        if (aoti_torch_empty_strided(2, sizes, strides, f32, 0, 0, &h)) return -1;
        if (aoti_torch_delete_tensor_object(h)) return -1; calls += 2; break;
      case 3: case 5:
        if (aoti_torch__reinterpret_tensor(base, 2, vsizes, strides, 16, &h)) return -1;
        if (aoti_torch_delete_tensor_object(h)) return -1; calls += 2; break;
      default: (void)aoti_torch_dtype_float32(); calls += 1; break;
    }
  }
  double dt = now_ns() - t0;
  aoti_torch_delete_tensor_object(base);
  return dt / calls;
}
"""

PATTERNS = {
    0: "get_data_ptr",
    1: "get_sizes",
    2: "empty_strided + delete_tensor_object",
    3: "_reinterpret_tensor (holes, offset) + delete",
    4: "dtype_float32 (constant, native)",
    5: "_reinterpret_tensor of a Python tensor + delete",
}


def _driver(tmp: Path, bridge_path: Path):
    """The driver links the bridge by path, like a model's wrapper: the bridge is RTLD_LOCAL."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SystemExit("etmetal bench shims: needs a C compiler")
    src, so = tmp / "driver.c", tmp / "driver.so"
    src.write_text(_DRIVER)
    link = ["-Wl,--no-as-needed", str(bridge_path)]
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(so), str(src), *link], check=True)
    lib = ctypes.PyDLL(str(so), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    lib.etm_bench.restype = ctypes.c_double
    lib.etm_bench.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib


def bench_calls(n: int) -> dict[str, float]:
    from etmetal.shims import load_bridge

    bridge = load_bridge()
    with tempfile.TemporaryDirectory(prefix="etmetal-bench-") as tmp:
        lib = _driver(Path(tmp), bridge.path)
        lib.etm_bench(0, 1000)  # warm up
        out = {}
        for which, name in PATTERNS.items():
            ns = min(lib.etm_bench(which, n) for _ in range(3))
            if ns < 0:
                raise SystemExit(f"shim call failed in pattern {name!r}")
            out[name] = ns
    return out


def bench_models(runs: int) -> list[tuple[str, float, float]]:
    from etmetal.backend.aoti_compile import compile_exported_program
    from etmetal.examples.strided_views import CASES, exported
    from etmetal.shims import AotiModel, load_bridge

    bridge = load_bridge()
    rows = []
    for case in CASES:
        art = compile_exported_program(exported(case))
        inputs = list(case.make_inputs())
        with AotiModel(art.so_path, art.weights_path.read_bytes()) as model:
            for _ in range(20):
                model.run(inputs)
            calls0, t0 = bridge.calls, time.perf_counter()
            for _ in range(runs):
                model.run(inputs)
            dt = (time.perf_counter() - t0) / runs
            rows.append((case.name, dt * 1e6, (bridge.calls - calls0) / runs))
    return rows


def _best_interleaved(fns, repeat: int = 12) -> list[float]:
    """Best time of each function, run in turns so machine load drifts hit all alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [min(t) for t in times]


def bench_gather(mib: int) -> list[tuple[str, float, float]]:
    """(layout, gather GB/s, ratio to a contiguous copy of the same bytes)."""
    from etmetal.shims.storage import Storage, Tensor

    nbytes = mib << 20
    n = nbytes // 4
    src, dst = torch.randn(n), torch.empty(n)
    layouts = {
        # half of every row of a [rows, 2*64] buffer: chunk(2, -1) of a linear output
        "chunk(2,-1), 256 B runs": 64,
        # half of the channels of a channels-last [N*H*W, 2*16] buffer: 64 B runs
        "channels-last chunk(2,1), 64 B runs": 16,
    }
    fns, checks = [lambda: dst.copy_(src)], []
    for run in layouts.values():
        rows = n // run
        buf = torch.randn(rows * 2 * run)
        # the view as the shims see it: a shim Tensor with holes over a borrowed storage
        view = Tensor(Storage.borrow_tensor(buf), 6, (rows, run), (2 * run, 1), run).torch()
        out = torch.empty(rows, run)
        fns.append(lambda v=view, o=out: o.copy_(v))
        checks.append((out, buf.view(rows, 2 * run)[:, run:]))
    copy_s, *gather_s = _best_interleaved(fns)
    for out, expected in checks:
        assert torch.equal(out, expected)
    rows = [("contiguous copy", nbytes / copy_s / 1e9, 1.0)]
    rows += [(name, nbytes / g / 1e9, copy_s / g) for name, g in zip(layouts, gather_s)]
    return rows
