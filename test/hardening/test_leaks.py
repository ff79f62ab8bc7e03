"""10,000 executes of each demo model under the Metal delegate leak nothing.

After a warm-up, the shim layer's live storages and tensors must be exactly what they
were, and the resident set may grow by less than 1 MiB: in process, and with
``isolate=True`` for both the host and the worker process.
"""

from __future__ import annotations

import pytest

from etmetal.runtime import Runtime
from etmetal.shims import memory_stats
from etmetal.testing.resident import resident_bytes

EXECUTES = 10_000
WARMUP = 3000  # main's shims grow one ~1.1 MiB step within the first ~2,000 runs
MIB = 1 << 20


def snapshot(method) -> tuple:
    host = method.isolation
    if host is None:
        s = memory_stats()
        return (s.tensors, s.storages, s.bytes), resident_bytes(), 0
    stats, worker_rss = host.worker_stats()
    return stats[:3], resident_bytes(), worker_rss


@pytest.mark.rss_flat  # measures RSS: not under ASan (etmetal regress sanitize)
@pytest.mark.parametrize("isolate", [False, True], ids=["in_process", "isolated"])
@pytest.mark.parametrize("name", ["transformer_block", "patch_embedding"])
def test_ten_thousand_executes_keep_storages_and_rss_flat(demos, name, isolate):
    demo = demos[name]
    program = Runtime.get().load_program(demo.pte, trust_native_code=True, isolate=isolate)
    method = program.load_method("forward")
    for _ in range(WARMUP):
        method.execute(demo.inputs)
    live0, host0, worker0 = snapshot(method)
    for _ in range(EXECUTES):
        out = method.execute(demo.inputs)
    live1, host1, worker1 = snapshot(method)
    print(
        f"\n{name} isolate={isolate}: live (tensors, storages, bytes) {live0} -> {live1}; "
        f"host RSS growth {(host1 - host0) / 1024:.0f} KiB"
        + (f", worker RSS growth {(worker1 - worker0) / 1024:.0f} KiB" if isolate else "")
    )
    assert live1 == live0
    assert host1 - host0 < MIB
    assert worker1 - worker0 < MIB
    assert len(out) == 1 and out[0].shape == demo.expected.shape
    method.destroy()
