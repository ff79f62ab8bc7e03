"""Resident memory of this process, as the steady-state tests measure it."""

from __future__ import annotations

import contextlib
import ctypes
import os


def resident_bytes() -> int:
    """The process's resident set size, in bytes, after glibc returns the free memory at its
    heap's top to the system: what is left is live memory, not where the allocator's free
    lists happened to stand. A flat-RSS check that read statm alone saw one-off heap
    extensions of ~1 MiB that came and went with unrelated allocations around its loop; a
    real leak is live, so trimming cannot hide it."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: statm as it stands
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
