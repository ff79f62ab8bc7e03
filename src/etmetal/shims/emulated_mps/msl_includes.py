"""Which files a shader library may ``#include``: Metal's standard headers (stand-ins), c10's
Metal headers and the few C++ headers etmetal's compat header includes anyway.

A library's source comes from a ``.so``, which may be hostile; the host preprocessor would
otherwise open any file it names (``#include "/etc/shadow"``) and the compile errors would
quote it. Two checks keep that out:

- :func:`check_source` reads the directives of the source itself (comments removed, lines
  spliced, digraphs too) before the preprocessor runs: an include of anything else, or one
  computed by a macro, is refused by name;
- :func:`check_markers` reads the preprocessor's line markers before the output is
  compiled: every file entered directly from the library must be one of the allowed ones
  (a backstop for directives the textual check did not see).
"""

from __future__ import annotations

import os
import re

from etmetal.shims.emulated_mps.msl_parse import ParseError

# what msl_compat.h includes before any library text: naming them again reads nothing new
STD_HEADERS = frozenset(
    ("array", "cfloat", "climits", "cstddef", "cstdint", "limits", "type_traits", "utility")
)
_C10 = re.compile(r"^c10/metal/[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*\.h$")
_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*(include_next|include|import|embed)\b(.*)$", re.M)
_TARGET = re.compile(r'^\s*(?:<([^<>"\n]*)>|"([^"\n]*)")\s*$')
_COMMENT_OR_STRING = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S
)


def _strip_comments(text: str) -> str:
    """Comments become a space (phase 3); string literals stay (an include names one)."""

    def one(m: re.Match) -> str:
        s = m.group(0)
        if s.startswith("/*"):
            return " " + "\n" * s.count("\n")
        return " " if s.startswith("//") else s

    return _COMMENT_OR_STRING.sub(one, text)


def allowed_name(name: str, stub_headers: frozenset[str]) -> bool:
    return name in stub_headers or name in STD_HEADERS or bool(_C10.match(name))


def check_source(source: str, stub_headers: frozenset[str]) -> None:
    """Refuse an include of anything but the allowed headers (ParseError naming it)."""
    text = _strip_comments(source.replace("\\\r\n", "").replace("\\\n", ""))
    for m in _DIRECTIVE.finditer(text):
        word, rest = m.group(1), m.group(2)
        target = _TARGET.match(rest)
        if word != "include" or target is None:
            what = rest.strip()[:80] or "(nothing)"
            raise ParseError(
                "<library>",
                f"#{word} {what}: a shader library may only #include Metal's standard "
                "headers and <c10/metal/...> by name",
            )
        name = target.group(1) if target.group(1) is not None else target.group(2)
        if not allowed_name(name, stub_headers):
            raise ParseError(
                "<library>",
                f"#include of {name[:200]!r} refused: a shader library may only include "
                "Metal's standard headers and c10's Metal headers (<c10/metal/...>)",
            )


_MARKER = re.compile(r'^# \d+ "((?:[^"\\]|\\.)*)"((?: \d)*)$', re.M)


def check_markers(preprocessed: str, source_name: str, allowed_dirs: list[str]) -> None:
    """Every file the library itself entered must lie in ``allowed_dirs`` (ParseError)."""
    roots = [os.path.realpath(d) + os.sep for d in allowed_dirs if d]
    stack: list[str] = []
    for m in _MARKER.finditer(preprocessed):
        path, flags = m.group(1), m.group(2).split()
        if "1" in flags:
            parent = stack[-1] if stack else None
            if parent == source_name:
                real = os.path.realpath(path)
                if not any(real.startswith(r) for r in roots):
                    raise ParseError(
                        "<library>",
                        f"the library includes {path[:200]!r}, outside Metal's standard "
                        "headers and c10's Metal headers",
                    )
            stack.append(path)
        else:  # 2: back in the includer; no flag: a line (or file name) change in place
            if "2" in flags and stack:
                stack.pop()
            stack[-1:] = [path]
