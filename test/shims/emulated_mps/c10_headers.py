"""c10's Metal headers as Inductor pastes them into a shader library, read from the installed torch.

In an AOTI wrapper, Inductor replaces each kernel's ``#include <c10/metal/NAME.h>`` lines with
the headers' text (torch's ``_embed_headers``, every file once). The fixture stores only the
names; ``expand`` rebuilds the pasted text from ``torch/include`` at test time, and
``include_names`` recovers the names from a generated library.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils._cpp_embed_headers import _embed_headers

INCLUDE_DIR = Path(torch.__file__).parent / "include"
C10_METAL = INCLUDE_DIR / "c10" / "metal"


def expand(names: list[str]) -> str:
    """The text before the kernel in a library that includes ``names``, in that order: the
    pasted headers on the line Inductor writes them to (indented once, after ``R"MTL(``)."""
    lines = [f"#include <c10/metal/{name}.h>" for name in names]
    return "\n    " + _embed_headers(lines, [INCLUDE_DIR], set()) + "\n"


def include_names(head: str) -> list[str]:
    """The header names whose pasted text is ``head`` (the inverse of ``expand``).

    Each name adds its own text and that of the headers it includes that were not pasted
    yet, so the names are taken one at a time, the longest matching continuation first."""
    candidates = sorted(p.stem for p in C10_METAL.glob("*.h"))
    names: list[str] = []
    while expand(names) != head:
        best: tuple[int, str] | None = None
        for name in candidates:
            if name in names:
                continue
            text = expand([*names, name])[:-1]  # without the closing newline
            if head.startswith(text) and (best is None or len(text) > best[0]):
                best = (len(text), name)
        if best is None:
            raise ValueError(
                f"the text before the kernel is not c10's Metal headers of this torch "
                f"({C10_METAL}); matched {names} up to character {len(expand(names)) - 1}"
            )
        names.append(best[1])
    return names
