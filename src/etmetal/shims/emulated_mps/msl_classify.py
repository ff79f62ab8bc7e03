"""Which kernels of a preprocessed library can synchronise, decided before it is built.

A kernel that can never reach ``threadgroup_barrier`` nor a SIMD-group operation needs no
fiber: the dispatcher runs its threads as a plain loop (``etm_msl_loop_i``). Everything else
keeps the fiber path. The decision is by name, over the whole preprocessed text: a function
*taints* when a definition of that name contains a synchronising call or the name of a
tainted function, to a fixed point, and a kernel synchronises when its body names a tainted
function. Names are shared by overloads, methods and templates alike, so this can only err
towards fibers. Should it ever err the other way, a loop-run thread that reaches a barrier is
stopped with an error by the dispatcher (never a wrong answer).
"""

from __future__ import annotations

import re
from functools import lru_cache

from etmetal.shims.emulated_mps.msl_parse import CALL_LIKE_KEYWORDS

# The dispatcher's two synchronising calls (msl_abi.h), which every barrier and SIMD-group
# operation of msl_sync.h reaches, plus Metal's own names in case a header spells them out.
_ROOTS = re.compile(
    r"\b(?:etm_msl_threadgroup_barrier|etm_msl_simd_exchange|threadgroup_barrier"
    r"|simdgroup_barrier|simd_\w+|quad_\w+)\b"
)
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def _matching_back(text: str, close: int) -> int:
    """Index of the ``(`` opening the ``)`` at ``text[close]``."""
    depth = 0
    for j in range(close, -1, -1):
        if text[j] == ")":
            depth += 1
        elif text[j] == "(":
            depth -= 1
            if depth == 0:
                return j
    return -1


def _brace_end(text: str, open_: int) -> int:
    depth = 0
    for j in range(open_, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


_BEFORE_BODY = re.compile(r"\)\s*(?:const\s*|noexcept\s*|override\s*|&\s*|->\s*[\w:<>,\s*&]+?)*$")


# A library's build asks about the same preprocessed text up to three times (classification,
# the split path's taint and its plans): each answer is kept for the last few texts (read-only)
@lru_cache(maxsize=4)
def function_bodies(text: str) -> dict[str, list[tuple[int, int]]]:
    """Function name -> the (start, end) offsets of the bodies of its definitions."""
    bodies: dict[str, list[tuple[int, int]]] = {}
    for m in re.finditer(r"\{", text):
        head = text[max(0, m.start() - 300) : m.start()]
        hm = _BEFORE_BODY.search(head)
        if not hm:
            continue
        close = m.start() - len(head) + hm.start()
        open_ = _matching_back(text, close)
        if open_ < 0:
            continue
        nm = re.search(
            r"([A-Za-z_]\w*)\s*(?:<[^<>(){};]*>\s*)?$", text[max(0, open_ - 200) : open_]
        )
        if not nm or nm.group(1) in CALL_LIKE_KEYWORDS:
            continue
        bodies.setdefault(nm.group(1), []).append((m.start(), _brace_end(text, m.start())))
    return bodies


@lru_cache(maxsize=4)
def tainted_names(text: str) -> frozenset[str]:
    """Names of the functions that may synchronise."""
    bodies = function_bodies(text)
    idents = {
        name: {w for s, e in spans for w in _IDENT.findall(text, s, e)}
        for name, spans in bodies.items()
    }
    tainted = {
        name for name, spans in bodies.items() if any(_ROOTS.search(text, s, e) for s, e in spans)
    }
    changed = True
    while changed:
        changed = False
        for name, words in idents.items():
            if name not in tainted and not words.isdisjoint(tainted):
                tainted.add(name)
                changed = True
    return frozenset(tainted)


_MARKER = re.compile(r'^# \d+ "([^"]*)"([ \d]*)$', re.M)


def library_part(text: str, own_dir: str) -> str:
    """``text`` with everything outside the library and c10's headers blanked (same offsets):
    system headers cannot synchronise, and etmetal's own headers reach the dispatcher only
    through functions named like Metal's (``simd_*``, ``threadgroup_barrier``), which are
    roots by name. Scanning only the rest keeps this a small part of a library's build."""
    out, pos, keep = [], 0, True
    for m in _MARKER.finditer(text):
        chunk = text[pos : m.start()]
        out.append(chunk if keep else " " * len(chunk))
        out.append(m.group(0))
        path, flags = m.group(1), m.group(2).split()
        keep = "3" not in flags and not path.startswith((own_dir, "<"))
        pos = m.end()
    tail = text[pos:]
    out.append(tail if keep else " " * len(tail))
    return "".join(out)


def synchronising(
    text: str, spans: list[tuple[int, int]], own_dir: str | None = None
) -> list[bool]:
    """For each kernel span (declaration start, end) of ``text``: whether it may reach a
    barrier or a SIMD-group operation. A kernel's span is its definition, or for an explicit
    instantiation its declaration; an instantiation is judged by the template it names. With
    ``own_dir`` (etmetal's headers), only the library's and c10's code is scanned."""
    if own_dir is not None:
        text = library_part(text, own_dir)
    tainted = tainted_names(text)

    def body_syncs(s: int, e: int) -> bool:
        return _ROOTS.search(text, s, e) is not None or not tainted.isdisjoint(
            _IDENT.findall(text, s, e)
        )

    return [body_syncs(s, e) for s, e in spans]
