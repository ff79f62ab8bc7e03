"""The marked sections of BENCHMARKS.md: what a suite ``bench all`` does not run writes.

``bench llm`` and ``bench native`` take minutes and run on their own; each writes its own
section between two HTML comments naming it, and ``bench all --write-md``, which rewrites
the rest of the file, carries every such section over unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path

_MARKED = re.compile(r"<!-- etmetal bench (\w+) -->\n.*?<!-- /etmetal bench \1 -->", re.S)


def markers(suite: str) -> tuple[str, str]:
    """The comments a suite's section starts and ends with."""
    return f"<!-- etmetal bench {suite} -->", f"<!-- /etmetal bench {suite} -->"


def marked(suite: str, body: str) -> str:
    """``body`` (markdown) as the suite's marked section."""
    start, end = markers(suite)
    return f"{start}\n{body.strip()}\n\n{end}\n"


def write_section(path: Path, suite: str, body: str) -> None:
    """Put the suite's section into ``path``: in place of its old one, or at the end."""
    text = path.read_text() if path.exists() else ""
    section = marked(suite, body)
    old = next((m for m in _MARKED.finditer(text) if m.group(1) == suite), None)
    if old is not None:
        text = text[: old.start()] + section.rstrip("\n") + text[old.end() :]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
    print(f"wrote the {suite} section of {path}")


def carry_sections(path: Path, text: str) -> str:
    """``text`` (a regenerated report) with every marked section of ``path`` that ``text``
    lacks appended, in the order ``path`` has them."""
    old = path.read_text() if path.exists() else ""
    have = {m.group(1) for m in _MARKED.finditer(text)}
    carried = [m.group(0) for m in _MARKED.finditer(old) if m.group(1) not in have]
    if not carried:
        return text
    return text.rstrip("\n") + "\n\n" + "\n\n".join(carried) + "\n"
