"""What the Metal checker reports, and how its mode is switched on.

``ETMETAL_METAL_CHECK=memcheck,racecheck`` (either word, or ``all``; add ``report`` to
collect faults instead of failing the run) turns the check mode of the emulated Metal
device on for every shim context made afterwards; :func:`set_metal_check` does it for one
context. The checks:

- memcheck: reads and writes outside a binding's extent ("out-of-bounds read/write" of
  ``buffer(i)``), outside a threadgroup array, and reads of threadgroup bytes no thread of
  the threadgroup wrote ("uninitialized threadgroup read");
- racecheck: two threads of a threadgroup touching the same threadgroup byte, one of them
  writing, with no ``threadgroup_barrier`` between ("threadgroup race"), and two bindings of
  one dispatch over overlapping but different byte ranges, one of them written ("aliased
  bindings"; binding exactly the same range twice, as an in-place kernel does, is fine).

Each :class:`MetalFault` names the kernel, the threadgroup and the thread in it, the buffer
index (or the threadgroup array) and the byte offset.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass

CHECK_ENV = "ETMETAL_METAL_CHECK"
CHECKS = ("memcheck", "racecheck")
REPORT = "report"

# the dispatcher's fault kinds (msl_abi.h's etm_msl_fault_kind) -> (what, which check)
KINDS = {
    1: ("out-of-bounds read", "memcheck"),
    2: ("out-of-bounds write", "memcheck"),
    3: ("out-of-bounds threadgroup read", "memcheck"),
    4: ("out-of-bounds threadgroup write", "memcheck"),
    5: ("uninitialized threadgroup read", "memcheck"),
    6: ("threadgroup race (read after another thread's write)", "racecheck"),
    7: ("threadgroup race (write after another thread's read)", "racecheck"),
    8: ("threadgroup race (write after another thread's write)", "racecheck"),
    9: ("aliased bindings", "racecheck"),
}
_THREADGROUP_KINDS = {3, 4, 5, 6, 7, 8}
_RACES = {6, 7, 8}
_ALIAS = 9


class FaultRecord(ctypes.Structure):
    """msl_abi.h's etm_msl_fault."""

    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("buffer", ctypes.c_int32),
        ("offset", ctypes.c_int64),
        ("extent", ctypes.c_uint64),
        ("size", ctypes.c_uint32),
        ("site", ctypes.c_uint32),
        ("tg", ctypes.c_uint32 * 3),
        ("thread", ctypes.c_uint32 * 3),
        ("other", ctypes.c_uint32 * 3),
        ("other_known", ctypes.c_uint32),
        ("array_site", ctypes.c_uint32),
        ("overlap", ctypes.c_uint64),
        ("count", ctypes.c_uint64),
    ]


class CheckRun(ctypes.Structure):
    """msl_abi.h's etm_msl_check_run."""

    _fields_ = [
        ("extents", ctypes.POINTER(ctypes.c_uint64)),
        ("nargs", ctypes.c_uint32),
        ("max_faults", ctypes.c_uint32),
        ("faults", ctypes.POINTER(FaultRecord)),
        ("nfaults", ctypes.c_uint32),
        ("dropped", ctypes.c_uint64),
        ("accesses", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class MetalFault:
    """One fault of a checked dispatch (the first of ``count`` alike: same kind, memory and
    source site)."""

    kernel: str
    kind: str
    check: str
    threadgroup: tuple[int, int, int]  # threadgroup_position_in_grid
    thread: tuple[int, int, int]  # thread_position_in_threadgroup
    buffer: int | None  # [[buffer(i)]]; None for threadgroup memory
    memory: str  # "buffer(1)" or "threadgroup array 'tile'"
    offset: int  # bytes from the start of that memory
    size: int  # bytes accessed
    extent: int  # bytes of that memory
    site: str = ""  # file:line: the access
    other_thread: tuple[int, int, int] | None = None  # a race's other thread
    other_buffer: int | None = None  # aliased bindings: the other binding
    count: int = 1

    def __str__(self) -> str:
        where = (
            f"threadgroup {self.threadgroup} thread {self.thread}: {self.memory} "
            f"byte offset {self.offset}"
        )
        if self.other_buffer is not None:
            what = (
                f"{self.kind}: {self.memory} (written) and buffer({self.other_buffer}) overlap "
                f"in {self.size} bytes from {self.memory}'s byte offset {self.offset} "
                f"(extent {self.extent}); first written by threadgroup {self.threadgroup} "
                f"thread {self.thread}"
            )
            return f"kernel '{self.kernel}': {what}"
        detail = f"{self.size}-byte access, extent {self.extent}"
        if self.other_thread is not None:
            detail += f", other thread {self.other_thread}"
        elif self.kind.startswith("threadgroup race (write after"):
            detail += ", read by several other threads"
        more = f" (+{self.count - 1} more like it)" if self.count > 1 else ""
        at = f" at {self.site}" if self.site else ""
        return f"kernel '{self.kernel}': {self.kind}, {where} ({detail}){at}{more}"


@dataclass(frozen=True)
class CheckMode:
    checks: frozenset[str]
    collect: bool = False  # True: keep a report; False: a fault fails the dispatch


def parse_mode(text: str | Sequence[str], where: str = CHECK_ENV) -> CheckMode | None:
    """``"memcheck,racecheck"``, ``"all"``, ``"...,report"`` -> a mode; ``""``/``"0"``/
    ``"off"`` -> None. An unknown word is a ValueError naming it."""
    words = text.split(",") if isinstance(text, str) else list(text)
    words = [w.strip().lower() for w in words if w.strip()]
    if not words or words in (["0"], ["off"], ["none"]):
        return None
    checks, collect = set(), False
    for w in words:
        if w == "all":
            checks.update(CHECKS)
        elif w in CHECKS:
            checks.add(w)
        elif w == REPORT:
            collect = True
        else:
            raise ValueError(
                f"{where}: unknown check {w!r} (use {', '.join(CHECKS)}, all, and optionally "
                f"{REPORT})"
            )
    if not checks:
        raise ValueError(f"{where}: {text!r} names no check (use {', '.join(CHECKS)} or all)")
    return CheckMode(frozenset(checks), collect)


def mode_from_env() -> CheckMode | None:
    return parse_mode(os.environ.get(CHECK_ENV, ""))


def faults_of(
    kernel: str,
    records: Sequence[FaultRecord],
    sites: Sequence[object],
    checks: frozenset[str],
) -> list[MetalFault]:
    """The dispatcher's records as faults, those of the enabled checks only."""
    out = []
    for r in records:
        kind, check = KINDS.get(r.kind, (f"fault {r.kind}", "memcheck"))
        if check not in checks:
            continue
        site = sites[r.site] if r.site < len(sites) else None
        if r.kind in _THREADGROUP_KINDS:
            array = sites[r.array_site].text if r.array_site < len(sites) else "?"
            memory, buffer = f"threadgroup array '{array}'", None
        else:
            memory, buffer = f"buffer({r.buffer})", r.buffer
        alias = r.kind == _ALIAS
        out.append(
            MetalFault(
                kernel=kernel,
                kind=kind,
                check=check,
                threadgroup=tuple(r.tg),
                thread=tuple(r.thread),
                buffer=buffer,
                memory=memory,
                offset=r.offset,
                size=r.overlap if alias else r.size,
                extent=r.extent,
                site=str(site) if site is not None and not alias else "",
                other_thread=tuple(r.other) if r.other_known and r.kind in _RACES else None,
                other_buffer=r.other[0] if alias else None,
                count=r.count,
            )
        )
    return out
