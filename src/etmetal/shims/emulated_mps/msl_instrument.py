"""The checked build of a shader library: its memory subscripts routed through the checker.

Works on the ``g++ -E`` output of a checked preprocessing (``ETM_MSL_CHECK``: MSL's
``device`` reads ``__etm_device``), before the address spaces are rewritten, so each
pointer's address space is still written next to it. In every function of the library and
of the c10 headers it includes:

- pointer parameters of a kernel in ``device`` or ``constant`` memory are checked against
  their ``[[buffer(i)]]`` binding; other ``device`` pointers (helper parameters, locals)
  against the binding their address falls in. ``constant`` pointers that are not kernel
  parameters are left alone: they may point at a program-scope constant table;
- ``threadgroup`` arrays (declared in the kernel) and ``threadgroup`` pointer parameters go
  through the threadgroup shadow; each array's declaration registers it.

A subscript ``p[i]`` (or ``a[i][j]`` to an array's full rank) becomes
``(*device_access(__builtin_addressof(p[i]), buffer, flags, site))``: the same lvalue, so
types and overloads are untouched. The flags say read, write (``=``) or both (compound
assignment, ``++``/``--``); an address taken (``&p[i]``) is no access. Accesses made
without a subscript (``*p``, atomics, pointers passed on) are not checked.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from etmetal.shims.emulated_mps.msl_parse import (
    CALL_LIKE_KEYWORDS,
    ParseError,
    _parse_param,
    _split_top,
)

DEVICE_WORD = "__etm_device"
READ, WRITE = 1, 2

_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<marker>^\#[^\n]*)
    |(?P<lit>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    |(?P<id>[A-Za-z_]\w*)
    |(?P<num>\.?\d(?:[eEpP][+-]|[\w.])*)
    |(?P<op><<=|>>=|->|::|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|.)""",
    re.M | re.X | re.S,
)
_MARKER = re.compile(r'^# (\d+) "([^"]*)"([ \d]*)$', re.M)
_AFTER_PARAMS = frozenset(["const", "noexcept", "override", "final", "mutable", "constexpr"])
_COMPOUND = frozenset(["+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=", "++", "--"])
_VALUE_END = frozenset({")", "]"})


def _opens(s: str) -> bool:
    return s in ("(", "[", "{")


@dataclass(frozen=True)
class Site:
    """Where a checked access (or a threadgroup array's declaration) is in the source."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


@dataclass(frozen=True)
class _Tracked:
    space: str  # "device" or "threadgroup"
    buffer: int  # [[buffer(i)]], or -1: found by address
    rank: int  # subscripts that reach one element
    array: bool = False  # a declared threadgroup array (its own bounds apply)


class _Lines:
    """(file, line) of an offset of preprocessed text, from its line markers (bisected)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.marks = [(m.end() + 1, m.group(2), int(m.group(1))) for m in _MARKER.finditer(text)]
        self.starts = [m[0] for m in self.marks]

    def at(self, offset: int) -> tuple[str, int]:
        i = bisect.bisect_right(self.starts, offset) - 1
        if i < 0:
            return "", 1 + self.text.count("\n", 0, offset)
        start, file, line = self.marks[i]
        return file, line + self.text.count("\n", start, offset)


def _library_chunks(text: str, own_dir: str) -> list[tuple[int, int]]:
    """Spans of library code (the library and c10's headers): not system headers, not
    etmetal's own headers, not the preprocessor's built-ins."""
    spans, pos, library = [], 0, True
    for m in _MARKER.finditer(text):
        if library:
            spans.append((pos, m.start()))
        path, flags = m.group(2), m.group(3).split()
        library = "3" not in flags and not path.startswith((own_dir, "<"))
        pos = m.end()
    if library:
        spans.append((pos, len(text)))
    return spans


def _tokens(text: str, spans: list[tuple[int, int]]) -> list[tuple[str, str, int, int]]:
    out = []
    for a, b in spans:
        for m in _TOKEN.finditer(text, a, b):
            kind = m.lastgroup
            if kind in ("ws", "marker"):
                continue
            out.append((kind, m.group(), m.start(), m.end()))
    return out


def _matches(toks: list) -> dict[int, int]:
    """Index of each bracket -> index of its partner, for () [] {}."""
    pairs, stack = {}, []
    closing = {")": "(", "]": "[", "}": "{"}
    for i, t in enumerate(toks):
        s = t[1]
        if s in "([{" and t[0] == "op":
            stack.append(i)
        elif s in closing and t[0] == "op":
            while stack and toks[stack[-1]][1] != closing[s]:
                stack.pop()  # unbalanced (a stray '<'-style token): recover
            if stack:
                j = stack.pop()
                pairs[i], pairs[j] = j, i
    return pairs


class _Instrumenter:
    def __init__(self, text: str, own_dir: str) -> None:
        self.text = text
        self.toks = _tokens(text, _library_chunks(text, own_dir))
        self.match = _matches(self.toks)
        self.lines = _Lines(text)
        self.sites: list[Site] = []
        self.inserts: list[tuple[int, int, str]] = []  # (offset, 0 closes / 1 opens, text)
        self.skip: set[int] = set()  # tokens of threadgroup declarators (no access there)

    def site(self, start: int, end: int, text: str | None = None) -> int:
        file, line = self.lines.at(start)
        snippet = text or " ".join(self.text[start:end].split())
        if len(snippet) > 70:
            snippet = snippet[:67] + "..."
        self.sites.append(Site(file.rsplit("/include/", 1)[-1], line, snippet))
        return len(self.sites) - 1

    def tok(self, i: int) -> str:
        return self.toks[i][1] if 0 <= i < len(self.toks) else ""

    # -- functions and their pointer parameters -------------------------------------------
    def function_params(self, brace: int) -> dict[str, _Tracked] | None:
        """The tracked parameters of the function whose body opens at ``brace`` (None if the
        brace opens no function body)."""
        j = brace - 1
        while j >= 0:
            if self.tok(j) in _AFTER_PARAMS:
                j -= 1
            elif self.tok(j) == "]" and self.tok(j - 1) == "]" and j in self.match:
                j = self.match[j] - 2  # an attribute [[...]]
            else:
                break
        if self.tok(j) != ")" or j not in self.match:
            return None
        opening = self.match[j]
        before = self.toks[opening - 1] if opening > 0 else ("op", "", 0, 0)
        if not (before[0] == "id" and before[1] not in CALL_LIKE_KEYWORDS) and before[1] not in (
            ">",
            "]",
        ):
            return None
        head = opening - 1
        while head >= 0 and self.tok(head) not in (";", "{", "}"):
            head -= 1
        is_kernel = any(self.tok(k) == "kernel" for k in range(head + 1, opening))
        params = self.text[self.toks[opening][3] : self.toks[j][2]]
        return self.parse_params(params, is_kernel)

    @staticmethod
    def parse_params(params: str, is_kernel: bool) -> dict[str, _Tracked]:
        tracked: dict[str, _Tracked] = {}
        auto = [0]
        for raw in _split_top(params):
            words = set(re.findall(r"[A-Za-z_]\w*", re.sub(r"\[\[.*?\]\]", " ", raw, flags=re.S)))
            buffer = -1
            if is_kernel:
                try:
                    buffer = _parse_param("", raw, auto).buffer
                except (ParseError, ValueError):
                    buffer = None
            name = re.search(r"([A-Za-z_]\w*)\s*(?:\[\[.*\]\])?\s*$", raw.strip(), re.S)
            if not name or "*" not in raw:
                continue
            if "threadgroup" in words:
                tracked[name.group(1)] = _Tracked("threadgroup", -1, 1)
            elif (
                (DEVICE_WORD in words or ("constant" in words and is_kernel))
                and buffer is not None
                and (buffer >= 0 or DEVICE_WORD in words)
            ):
                tracked[name.group(1)] = _Tracked("device", buffer, 1)
        return tracked

    # -- declarations ---------------------------------------------------------------------
    def threadgroup_declaration(self, i: int, scope: dict) -> int:
        """Track the arrays/pointers declared from token ``i`` (``threadgroup``) to its ``;``
        and register each array after it; returns the ``;``'s index."""
        end = i
        while end < len(self.toks) and self.tok(end) != ";":
            end = self.match.get(end, end) + 1 if _opens(self.tok(end)) else end + 1
        if end >= len(self.toks):
            return end  # no ';': not a declaration this pass understands (the compiler decides)
        # declarators: top-level commas split them
        parts, cur, k = [], [], i + 1
        while k < end:
            if self.tok(k) == ",":
                parts.append(cur)
                cur = []
            else:
                cur.append(k)
            k = self.match.get(k, k) + 1 if _opens(self.tok(k)) else k + 1
        parts.append(cur)
        for part in parts:
            if not part:
                continue
            # the declarator, not its initializer (which is scanned for accesses as usual)
            stop = next((k for k in part if self.tok(k) == "="), None)
            head = [k for k in part if stop is None or k < stop]
            self.skip.update(range(part[0], stop if stop is not None else end))
            ids = [k for k in head if self.toks[k][0] == "id"]
            if not ids:
                continue
            array = [k for k in ids if self.tok(k + 1) == "["]
            name_i = array[-1] if array else ids[-1]
            name = self.tok(name_i)
            rank, k = 0, name_i + 1
            while self.tok(k) == "[" and k in self.match:
                rank, k = rank + 1, self.match[k] + 1
            if rank:
                scope[name] = _Tracked("threadgroup", -1, rank, array=True)
                site = self.site(self.toks[name_i][2], self.toks[name_i][3], name)
                at = self.toks[end][3]
                self.inserts.append((at, 0, f" ::etm::check::declare_tg({name}, {site}u);"))
            elif self.tok(name_i - 1) == "*":
                scope[name] = _Tracked("threadgroup", -1, 1)
        return end

    def device_local(self, i: int, scope: dict) -> None:
        """``device T* p = ...``: track ``p`` (its binding is found by address)."""
        k = i
        while k < len(self.toks) and self.tok(k) not in ("=", ";", ",", ")", "{"):
            k += 1
        if k - 2 > i and self.toks[k - 1][0] == "id" and self.tok(k - 2) == "*":
            scope[self.tok(k - 1)] = _Tracked("device", -1, 1)

    # -- accesses -------------------------------------------------------------------------
    def flags(self, first: int, last: int) -> int | None:
        prev, prev2 = (
            self.toks[first - 1] if first else None,
            self.toks[first - 2] if first > 1 else None,
        )
        if (
            prev
            and prev[1] == "&"
            and not (
                prev2
                and (
                    prev2[1] in _VALUE_END
                    or prev2[0] in ("num", "lit")
                    or (prev2[0] == "id" and prev2[1] not in CALL_LIKE_KEYWORDS)
                )
            )
        ):
            return None  # &p[i]: an address, no access
        if prev and prev[1] in ("++", "--"):
            return READ | WRITE
        j = last + 1
        while self.tok(j) == "." and j + 1 < len(self.toks) and self.toks[j + 1][0] == "id":
            j += 2
        after = self.tok(j)
        if after == "=":
            return WRITE
        if after in _COMPOUND:
            return READ | WRITE
        return READ

    def access(self, i: int, what: _Tracked) -> None:
        k, depth = i + 1, 0
        while depth < what.rank and self.tok(k) == "[" and k in self.match:
            k, depth = self.match[k] + 1, depth + 1
        if depth < what.rank:
            return  # a row of an array (a pointer), not an element
        flags = self.flags(i, k - 1)
        if flags is None:
            return
        start, end = self.toks[i][2], self.toks[k - 1][3]
        site = self.site(start, end)
        if what.space == "device":
            opening = "(*::etm::check::device_access(__builtin_addressof("
            closing = f"), {what.buffer}, {flags}u, {site}u))"
        else:
            if what.array:
                opening = "(*::etm::check::tg_array_access(__builtin_addressof("
                closing = f"), {self.tok(i)}, {flags}u, {site}u))"
            else:
                opening = "(*::etm::check::tg_access(__builtin_addressof("
                closing = f"), {flags}u, {site}u))"
        self.inserts.append((start, 1, opening))
        self.inserts.append((end, 0, closing))

    def run(self) -> str:
        scopes: list[dict[str, _Tracked]] = []
        in_function: list[bool] = []
        i, n = 0, len(self.toks)
        while i < n:
            kind, s = self.toks[i][0], self.toks[i][1]
            if s == "{" and kind == "op":
                params = self.function_params(i)
                inside = bool(in_function and in_function[-1]) or params is not None
                scopes.append(params or {})
                in_function.append(inside)
            elif s == "}" and kind == "op":
                if scopes:
                    scopes.pop()
                    in_function.pop()
            # (tokens in self.skip were rewritten already: left alone)
            elif kind == "id" and in_function and in_function[-1] and i not in self.skip:
                at_start = self.tok(i - 1) in (";", "{", "}", "")
                if s == "threadgroup" and at_start:
                    self.threadgroup_declaration(i, scopes[-1])
                elif s == DEVICE_WORD and (at_start or self.tok(i - 1) == "const"):
                    self.device_local(i, scopes[-1])
                elif self.tok(i + 1) == "[" and self.tok(i - 1) not in (".", "->", "::"):
                    what = next((sc[s] for sc in reversed(scopes) if s in sc), None)
                    if what is not None:
                        self.access(i, what)
            i += 1
        out, pos = [], 0
        for at, _, piece in sorted(self.inserts, key=lambda t: (t[0], t[1])):
            out.append(self.text[pos:at])
            out.append(piece)
            pos = at
        out.append(self.text[pos:])
        return strip_device_word("".join(out))


def instrument(text: str, own_dir: str) -> tuple[str, list[Site]]:
    """The checked variant of preprocessed library text, and its access sites (a site's
    index is what the checker reports)."""
    ins = _Instrumenter(text, own_dir)
    return ins.run(), ins.sites


def strip_device_word(text: str) -> str:
    """Remove the checked preprocessing's device marker (it has done its work)."""
    return re.sub(rf"\b{DEVICE_WORD}\b", " ", text)
