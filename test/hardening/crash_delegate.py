"""A test delegate over a hand-written AOTI container ``.so`` that can segfault in ``Run``.

The C source exports the AOTI container API etmetal's ``AotiModel`` drives: an identity
model (the output handle is the stolen input handle) whose ``Run`` dereferences NULL
while the file named by ``$ETMETAL_TEST_CRASH_FLAG`` exists (and never returns while
``$ETMETAL_TEST_HANG_FLAG`` names an existing file). ``CrashBackend`` is the
runtime delegate (processed bytes: the ``.so``'s path) and its AOT ``BackendDetails``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult

from etmetal.runtime import BackendExecutor

FLAG_ENV = "ETMETAL_TEST_CRASH_FLAG"
HANG_ENV = "ETMETAL_TEST_HANG_FLAG"

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
typedef int32_t rc_t;
static int alive;
extern rc_t aoti_torch_get_dim(void *tensor, int64_t *ret);
rc_t AOTInductorModelContainerCreateWithDevice(void **h, size_t n, const char *d, const char *b) {
  *h = malloc(16); alive = 1; return 0;
}
rc_t AOTInductorModelContainerDelete(void *h) { free(h); return 0; }
rc_t AOTInductorModelContainerRun(void *h, void **in, size_t n_in, void **out, size_t n_out,
                                  void *stream, void *proxy) {
  const char *flag = getenv("ETMETAL_TEST_CRASH_FLAG");
  if (flag && access(flag, F_OK) == 0) { volatile int *p = 0; *p = alive; }
  const char *hang = getenv("ETMETAL_TEST_HANG_FLAG");
  if (hang && access(hang, F_OK) == 0) for (;;) pause();
  int64_t dim = 0;
  if (aoti_torch_get_dim(in[0], &dim) != 0) return 1;
  out[0] = in[0];  /* identity: the stolen input handle becomes the output */
  return 0;
}
static rc_t one(void *h, uint64_t *n) { *n = 1; return 0; }
static rc_t zero(void *h, uint64_t *n) { *n = 0; return 0; }
rc_t AOTInductorModelContainerGetNumInputs(void *h, uint64_t *n) { return one(h, n); }
rc_t AOTInductorModelContainerGetNumOutputs(void *h, uint64_t *n) { return one(h, n); }
rc_t AOTInductorModelContainerGetNumConstants(void *h, uint64_t *n) { return zero(h, n); }
rc_t AOTInductorModelContainerGetConstantsBlobSize(void *h, uint64_t *n) { return zero(h, n); }
rc_t AOTInductorModelUpdateConstantsFromBlob(void *h, const uint8_t *b) { return 0; }
rc_t AOTInductorGetLastError(const char **m) { *m = "crash model"; return 0; }
"""


def build_crash_so(directory: Path) -> Path:
    src = directory / "crash_model.c"
    so = directory / "crash_model.so"
    src.write_text(C_SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(src)], check=True)
    return so


class CrashBackend(BackendDetails):
    """AOT side: the processed bytes are the ``.so`` path given as compile spec ``so``."""

    @staticmethod
    def preprocess(edge_program, compile_specs):
        spec = {s.key: s.value for s in compile_specs}
        return PreprocessResult(processed_bytes=bytes(spec["so"]))


class CrashExecutor(BackendExecutor):
    """Run side: the identity ``.so`` through etmetal's ``AotiModel``."""

    @classmethod
    def init(cls, context, processed, compile_specs):
        from etmetal.shims import AotiModel

        self = cls()
        self.model = AotiModel(bytes(processed).decode())
        return self

    def execute(self, args):
        (result,) = self.model.run([args[0]])
        args[1].copy_(result)

    def destroy(self):
        self.model.close()


class Identity(torch.nn.Module):
    def forward(self, x):
        return x + 0.0


def crash_pte(so: Path) -> bytes:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from executorch.exir.backend.canonical_partitioners.all_node_partitioner import (
        AllNodePartitioner,
    )
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    ep = torch.export.export(Identity(), (torch.randn(4, 3),), strict=False)
    part = AllNodePartitioner("CrashBackend", [CompileSpec("so", str(so).encode())])
    edge = to_edge_transform_and_lower(
        ep, partitioner=[part], compile_config=EdgeCompileConfig(_check_ir_validity=False)
    )
    return edge.to_executorch().buffer
