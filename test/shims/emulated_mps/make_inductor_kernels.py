"""Regenerate ``inductor_kernels.json``: Inductor's real Metal code generation, run on this host.

Each case of ``inductor_cases.CASES`` is exported with ``mps`` fake inputs and compiled by
AOTInductor for ``mps`` (``package_cpp_only``), with the patches that let the mps codegen run on
Linux scoped to the compile. From the wrapper ``.cpp`` it keeps each shader library's source
(c10's pasted headers stored as the names of the ``#include`` lines they came from, read
back from the installed torch by ``c10_headers``, plus the sha256 of the whole source so the
test can check it rebuilt the exact text) and the launch sequence: buffer
allocations, ``set_arg_tensor`` indices, thread and threadgroup sizes, outputs.

    python test/shims/emulated_mps/make_inductor_kernels.py [case ...]
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
import zipfile
from pathlib import Path
from unittest import mock

import torch
import torch._inductor.codegen.cpp_wrapper_gpu as cpp_wrapper_gpu
import torch._inductor.fx_passes.freezing_patterns as freezing_patterns
import torch._inductor.fx_passes.joint_graph as joint_graph
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).parent))
from c10_headers import include_names  # noqa: E402
from inductor_cases import CASES, specs  # noqa: E402

OUT = Path(__file__).parent / "inductor_kernels.json"


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def wrapper_source(name: str) -> str:
    fn = CASES[name][0]
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = tuple(torch.empty(shape, dtype=dtype, device="mps") for shape, dtype in specs(name))
    ep = torch.export.export(_Fn(fn), args)
    jg, fp = joint_graph.lazy_init, freezing_patterns.lazy_init
    with (
        mock.patch.object(joint_graph, "lazy_init", lambda *a, **k: jg(torch.device("cpu"))),
        mock.patch.object(freezing_patterns, "lazy_init", lambda *a, **k: fp(torch.device("cpu"))),
        mock.patch.object(torch._C, "_mps_get_core_count", lambda: 8, create=True),
        mock.patch.object(torch._C, "_mps_get_name", lambda: "Apple M1", create=True),
        mock.patch.object(cpp_wrapper_gpu, "get_gpu_type", lambda: "mps"),
        tempfile.TemporaryDirectory() as tmp,
    ):
        path = torch._inductor.aoti_compile_and_package(
            ep,
            package_path=f"{tmp}/{name}.pt2",
            inductor_configs={
                "aot_inductor.package_cpp_only": True,
                "aot_inductor.link_libtorch": False,
            },
        )
        z = zipfile.ZipFile(path)
        cpp = next(n for n in z.namelist() if n.endswith(".wrapper.cpp"))
        return z.read(cpp).decode()


def split_library(src: str) -> dict:
    """The source as (the names of c10's pasted headers, the kernel): the headers' text is
    torch's, read from the installed torch when the test runs, not stored here."""
    m = re.search(r"^[^\n]*(\[\[max_total_threads_per_threadgroup|kernel void)", src, re.M)
    head, kernel = src[: m.start()], src[m.start() :]
    return {"includes": include_names(head), "kernel": kernel}


def _numbers(text: str) -> list[int]:
    return [int(v) for v in re.findall(r"static_cast<uint64_t>\((\d+)L?\)", text)]


def _sizes(lam: str) -> dict:
    """threads/group of the lambda's dispatch (group None: the runtime picks, dispatch_single)."""
    single = re.search(r"aoti_torch_mps_dispatch_single\(handle, ([^;]*)\);", lam)
    if single:
        return {"threads": _numbers(single.group(1)), "group": None}
    arrays = {
        k: _numbers(v) for k, v in re.findall(r"mps_lib_\d+_(\w+)_array\[\] = \{([^}]*)\}", lam)
    }
    return {"threads": arrays["threads"], "group": arrays["group_size"]}


def launches(cpp: str) -> dict:
    body = cpp[cpp.rindex("AOTInductorModel::run_impl(") :]
    for bad in re.findall(
        r"\b(aoti_torch_mps_(?!start_encoding|set_arg_tensor|set_arg_int|dispatch|run_command_block|shared_callback)\w+)",
        body,
    ):
        raise RuntimeError(f"the wrapper calls {bad}; this fixture only replays kernels")
    arrays = {
        m.group(1): [int(v.strip().rstrip("L")) for v in m.group(2).split(",") if v.strip()]
        for m in re.finditer(r"int64_t (int_array_\d+)\[\] = \{([^}]*)\};", body)
    }
    buffers = {}
    for m in re.finditer(
        r"aoti_torch_empty_strided\(\d+, (int_array_\d+), (int_array_\d+), cached_torch_dtype_(\w+), [^&]*&(\w+)_handle\)",
        body,
    ):
        buffers[m.group(4)] = {
            "size": arrays[m.group(1)],
            "stride": arrays[m.group(2)],
            "dtype": m.group(3),
        }
    steps = []
    for m in re.finditer(
        r"auto (mps_lib_\d+)_lambda_\d+ = \[&\]\(AOTIMetalKernelFunctionHandle handle\) \{(.*?)\n    \};",
        body,
        re.S,
    ):
        lam = m.group(2)
        steps.append(
            {
                "lib": m.group(1),
                "args": {
                    int(i): n for i, n in re.findall(r"set_arg_tensor\(handle, (\d+), (\w+)\)", lam)
                },
                **_sizes(lam),
            }
        )
        assert "set_arg_int" not in lam, "integer arguments are not replayed by this fixture"
    outputs = re.findall(r"output_handles\[\d+\] = (\w+)\.release\(\)", body)
    # Inductor reuses a dead buffer under a new name: `auto buf2 = std::move(buf0);  // reuse`
    aliases = dict(re.findall(r"auto (\w+) = std::move\((\w+)\);", body))
    known = set(buffers) | set(aliases) | set(re.findall(r"auto (arg\d+_\d+) = ", body))
    for name in [n for step in steps for n in step["args"].values()] + outputs:
        if name not in known:
            raise RuntimeError(f"{name} is neither an input, an allocation nor a reuse")
    return {"buffers": buffers, "aliases": aliases, "steps": steps, "outputs": outputs}


def main(names: list[str]) -> None:
    data = json.loads(OUT.read_text()) if OUT.exists() else {"cases": {}}
    for name in names or list(CASES):
        try:
            cpp = wrapper_source(name)
            replay = launches(cpp)
        except Exception as e:  # a case Inductor cannot lower for mps here: say so, go on
            print(f"{name}: skipped ({type(e).__name__}: {str(e)[:200]})", flush=True)
            continue
        libs = {}
        for lib, src in re.findall(
            r'const char\* (mps_lib_\d+)_source = \(R"MTL\((.*?)\)MTL"\);', cpp, re.S
        ):
            libs[lib] = {
                **split_library(src),
                "sha256": hashlib.sha256(src.encode()).hexdigest(),
            }
        data["cases"][name] = {"torch": torch.__version__, "libraries": libs, **replay}
        print(name, len(libs), "libraries", flush=True)
        OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
