"""Reading kernels out of a preprocessed MSL library and turning it into C++ for this host.

Works on ``g++ -E`` output (macros expanded, c10 headers pasted, no comments), so kernels made
by macros (``template [[host_name("...")]] kernel void f<float>(...);``) are seen as written.
Two MSL words are left to this module rather than to macros, because their meaning depends on
where they stand:

- ``kernel`` marks the functions to export; it is removed after they are recorded;
- ``threadgroup`` qualifies a pointer parameter (nothing to do on a flat host memory) or
  declares threadgroup memory (``threadgroup float tmp[32];``), which must be shared by the
  threads of a threadgroup: it becomes ``static thread_local``, since the dispatcher runs a
  threadgroup's threads on one OS thread and one threadgroup at a time per OS thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# Thread-position attributes -> the field of etm_msl_thread (msl_abi.h) that carries them.
# keywords followed by a parenthesized operand that are not calls of a function (the
# classifier's call graph and the instrumenter's subscript scan both skip them)
CALL_LIKE_KEYWORDS = frozenset(
    [
        "if",
        "for",
        "while",
        "switch",
        "catch",
        "return",
        "sizeof",
        "alignof",
        "alignas",
        "decltype",
        "static_assert",
        "noexcept",
        "requires",
        "defined",
        "__attribute__",
    ]
)
POSITION_FIELDS = {
    "thread_position_in_grid": ("grid_pos", 3),
    "thread_position_in_threadgroup": ("tg_pos", 3),
    "threadgroup_position_in_grid": ("tg_id", 3),
    "threads_per_threadgroup": ("tg_size", 3),
    "dispatch_threads_per_threadgroup": ("dispatch_tg_size", 3),
    "threads_per_grid": ("grid_size", 3),
    "threadgroups_per_grid": ("tgs_per_grid", 3),
    "thread_index_in_threadgroup": ("index_in_tg", 1),
    "thread_index_in_simdgroup": ("lane", 1),
    "simdgroup_index_in_threadgroup": ("simd_index", 1),
    "simdgroups_per_threadgroup": ("simds_per_tg", 1),
    "threads_per_simdgroup": ("simd_size", 1),
    "thread_execution_width": ("simd_size", 1),
    "dispatch_simdgroups_per_threadgroup": ("dispatch_simds_per_tg", 1),
    "quadgroup_index_in_threadgroup": ("quad_index", 1),
    "thread_index_in_quadgroup": ("lane_in_quad", 1),
    "quadgroups_per_threadgroup": ("quads_per_tg", 1),
}


class ParseError(Exception):
    """A kernel uses something this executor cannot bind; ``kernel`` names it."""

    def __init__(self, kernel: str, message: str) -> None:
        super().__init__(message)
        self.kernel = kernel


@dataclass
class Param:
    name: str
    type: str
    buffer: int | None = None  # [[buffer(i)]]
    position: str | None = None  # a POSITION_FIELDS key
    threadgroup: bool = False  # a threadgroup-memory pointer: no set_arg_* may bind it


@dataclass
class Kernel:
    name: str  # the host name the library is asked for
    call: str  # the C++ function to call (qualified, with template arguments)
    params: list[Param] = field(default_factory=list)
    start: int = 0  # offsets of the declaration in the preprocessed text
    end: int = 0
    max_threads: int | None = None  # [[max_total_threads_per_threadgroup(N)]]
    # may reach a barrier or SIMD-group operation (msl_classify); False: a loop entry runs it
    sync: bool = True
    # how a dispatch runs it: "loop" (never synchronises), "split" (loops between its
    # synchronising statements, msl_split.py), "fibers"; path_reason says why, or which of its
    # statements run on fibers
    path: str = "fibers"
    path_reason: str = ""
    # a split kernel whose threadgroups also run in batches (msl_split.py's BATCHED)
    batch: bool = False

    @property
    def buffer_indices(self) -> tuple[int, ...]:
        return tuple(sorted(p.buffer for p in self.params if p.buffer is not None))


_KERNEL = re.compile(r"\bkernel\s+void\b")
_ATTR = re.compile(r"\[\[(.*?)\]\]", re.S)
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _matching(text: str, i: int, open_c: str, close_c: str) -> int:
    """Index of the bracket closing the one at ``text[i]``."""
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _split_top(text: str) -> list[str]:
    """Split a parameter list at top-level commas."""
    out, depth, cur = [], 0, []
    for c in text:
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def _statement_start(text: str, i: int) -> int:
    """Start of the declaration containing offset ``i`` (after the previous ; { or })."""
    j = i - 1
    depth = 0
    while j >= 0:
        c = text[j]
        if c == "]":
            depth += 1
        elif c == "[":
            depth -= 1
        elif depth == 0 and c in ";{}":
            return j + 1
        j -= 1
    return 0


def _parse_param(kernel: str, text: str, auto_index: list[int]) -> Param:
    attrs = [a.strip() for a in _ATTR.findall(text)]
    decl = _ATTR.sub(" ", text).strip()
    m = re.search(r"([A-Za-z_]\w*)\s*$", decl)
    if not m:
        raise ParseError(kernel, f"cannot read the parameter '{text.strip()}'")
    name, ptype = m.group(1), decl[: m.start()].strip()
    threadgroup = re.search(r"\bthreadgroup\b", ptype) is not None
    if threadgroup:
        ptype = re.sub(r"\bthreadgroup\b", " ", ptype).strip()
    param = Param(name=name, type=ptype, threadgroup=threadgroup)
    for attr in attrs:
        am = re.match(r"(\w+)\s*(?:\((.*)\))?$", attr, re.S)
        key = am.group(1) if am else attr
        if key == "buffer":
            param.buffer = int(am.group(2), 0)
        elif key in POSITION_FIELDS:
            param.position = key
        elif key in ("threadgroup", "texture", "sampler", "stage_in", "function_constant"):
            raise ParseError(kernel, f"unsupported kernel parameter [[{attr}]] on '{name}'")
        else:
            raise ParseError(
                kernel, f"unsupported kernel parameter attribute [[{attr}]] on '{name}'"
            )
    if param.position is None and param.buffer is None:
        param.buffer = auto_index[0]
    if param.buffer is not None:
        auto_index[0] = param.buffer + 1
    return param


def find_kernels(text: str) -> list[Kernel]:
    """Every kernel the library exports: non-template definitions and explicit instantiations
    (named by their ``[[host_name]]``); primary templates export nothing themselves."""
    kernels: list[Kernel] = []
    for m in _KERNEL.finditer(text):
        start = _statement_start(text, m.start())
        start += len(text[start:]) - len(text[start:].lstrip())
        head = text[start : m.start()]
        paren = text.find("(", m.end())
        if paren < 0:
            continue
        fn = text[m.end() : paren].strip()
        close = _matching(text, paren, "(", ")")
        if close < 0:
            continue
        rest = text[close + 1 :].lstrip()
        while rest.startswith("[["):
            rest = rest[rest.find("]]") + 2 :].lstrip()
        is_definition = rest.startswith("{")
        end = close + 1
        if is_definition:
            end = _matching(text, text.find("{", close), "{", "}") + 1
        host = None
        max_threads = None
        for attr in _ATTR.findall(head):
            hm = re.match(r"\s*host_name\s*\((.*)\)\s*$", attr, re.S)
            if hm:
                host = "".join(_STRING.findall(hm.group(1)))
            tm = re.match(r"\s*max_total_threads_per_threadgroup\s*\((.*)\)\s*$", attr, re.S)
            if tm:
                try:
                    max_threads = int(tm.group(1).strip(), 0)
                except ValueError:
                    max_threads = None
        head_code = _ATTR.sub(" ", head)
        is_template = re.search(r"\btemplate\s*<", head_code) is not None
        is_instantiation = re.search(r"\btemplate\b(?!\s*<)", head_code) is not None
        if is_template and not is_instantiation:
            continue  # a primary template: its instantiations are the kernels
        name = host or re.sub(r"<.*", "", fn).split("::")[-1].strip()
        kernel = Kernel(name=name, call=fn, start=start, end=end, max_threads=max_threads)
        auto = [0]
        kernel.params = [_parse_param(name, p, auto) for p in _split_top(text[paren + 1 : close])]
        indices = [p.buffer for p in kernel.params if p.buffer is not None]
        if len(set(indices)) != len(indices):
            raise ParseError(name, f"two parameters bind the same [[buffer]] index {indices}")
        kernels.append(kernel)
    return kernels


_THREADGROUP = re.compile(r"\bthreadgroup\b(?!\s*\()")
_KERNEL_WORD = re.compile(r"\bkernel\b(?=\s+void\b)")
_CONSTANT = re.compile(r"\bconstant\b")
_DOUBLE_CONST = re.compile(r"\bconst(\s+)const\b")
_MARKER = re.compile(r'^# \d+ "([^"]*)"([ \d]*)$', re.M)


def in_library_code(text: str, fn: Callable[[str], str], own_dir: str | None = None) -> str:
    """Apply ``fn`` to the parts of preprocessed text that come from the library and the
    headers it includes (c10's), by the line markers: never to system headers (flag 3), whose
    identifiers are their own. With ``own_dir``, not to etmetal's compatibility headers in it
    nor to the preprocessor's ``<built-in>`` parts either: they are host C++ and keep C++'s
    rules (literal types)."""
    out, pos, library = [], 0, True
    for m in _MARKER.finditer(text):
        chunk = text[pos : m.start()]
        out.append(fn(chunk) if library else chunk)
        out.append(m.group(0))
        path, flags = m.group(1), m.group(2).split()
        library = "3" not in flags
        if own_dir is not None:
            library = library and not path.startswith((own_dir, "<"))
        pos = m.end()
    tail = text[pos:]
    out.append(fn(tail) if library else tail)
    return "".join(out)


# A string or character literal (left as is) or a floating literal with no suffix. MSL has no
# double: ``1e-05`` and ``64.0`` are float there, so code such as Inductor's
# ``auto eps = 1e-05; threadgroup_sum(float_scratch, x + eps, ...)`` type-checks only if the
# literal is float on the host too.
_FLOAT_LITERAL = re.compile(
    r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\''
    r"|(?<![\w.])((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)(?![\w.])"
)


def float_literals(text: str) -> str:
    """Give unsuffixed floating literals MSL's type (float) by appending ``f``."""
    return _FLOAT_LITERAL.sub(lambda m: m.group(0) + "f" if m.group(1) else m.group(0), text)


def constant_to_const(text: str) -> str:
    """``constant`` -> ``const`` (read-only memory), without doubling an existing ``const``."""
    return _DOUBLE_CONST.sub(r"const\1", _CONSTANT.sub("const", text))


def rewrite_address_spaces(text: str) -> str:
    return in_library_code(text, constant_to_const)


def rewrite(text: str) -> str:
    """Make the preprocessed library plain C++: drop ``kernel``, turn threadgroup-memory
    declarations into ``static thread_local`` and drop the pointer qualifier elsewhere."""

    def one(chunk: str) -> str:
        chunk = _KERNEL_WORD.sub("      ", chunk)

        def tg(m: re.Match) -> str:
            before = chunk[: m.start()].rstrip()
            stmt_end = re.match(r"[^;(){}]*;", chunk[m.end() :])
            at_statement_start = not before or before[-1] in ";{}" or before.endswith("]]")
            # `threadgroup float* p = &tile[i];` is a thread's pointer into threadgroup
            # memory (each thread its own), not threadgroup storage
            pointer = stmt_end and re.match(r"[^=\[]*\*", stmt_end.group(0))
            if at_statement_start and stmt_end and not pointer:
                return "static thread_local"
            return " "

        return _THREADGROUP.sub(tg, chunk)

    return in_library_code(text, one)


def entry_source(kernels: list[Kernel], loops: bool = True) -> str:
    """One ``extern "C"`` entry per kernel, one line each (a compiler error in an entry names
    its kernel by line number); with ``loops``, a kernel that never synchronises also gets
    ``etm_msl_loop_i``, which runs every thread of one threadgroup as a plain loop, and a split
    kernel gets one that calls its split function."""
    lines = ['# 1 "<etmetal kernel entries>"']
    calls = [_call(k) for k in kernels]
    for i, call in enumerate(calls):
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) void etm_msl_entry_{i}'
            f"(void* const* a, const etm_msl_thread* t) {{ (void)a; (void)t; {call}; }}"
        )
    for i, (k, call) in enumerate(zip(kernels, calls)):
        if loops and not k.sync:
            lines.append(
                f'extern "C" __attribute__((visibility("default"))) void etm_msl_loop_{i}'
                f"(void* const* a, const etm_msl_thread* g) {{ etm::for_each_thread(g, "
                f"[a](const etm_msl_thread* t) __attribute__((always_inline)) {{ {call}; }}); }}"
            )
        elif loops and k.path == "split":  # the dispatcher runs it as it runs a loop entry
            split = re.sub(r"(\w+)$", r"\1__etm_split", k.call)
            lines.append(
                f'extern "C" __attribute__((visibility("default"))) void etm_msl_loop_{i}'
                f"(void* const* a, const etm_msl_thread* g) {{ {split}(a, g); }}"
            )
            if k.batch:  # registered with the dispatcher while the library is loaded
                batch = re.sub(r"(\w+)$", r"\1__etm_batch", k.call)
                lines.append(
                    f'extern "C" __attribute__((visibility("default"))) void etm_msl_batch_{i}'
                    f"(void* const* a, const etm_msl_thread* g, uint32_t k) {{ {batch}(a, g, k); }}"
                    f" __attribute__((constructor)) static void etm_msl_reg_{i}() {{ "
                    f"etm_msl_register_batch(&etm_msl_loop_{i}, &etm_msl_batch_{i}); }}"
                    f" __attribute__((destructor)) static void etm_msl_unreg_{i}() {{ "
                    f"etm_msl_unregister_batch(&etm_msl_loop_{i}); }}"
                )
    # after every entry (an error in an entry still names its kernel by line): what each
    # [[buffer]] parameter takes, in buffer_indices order, as the compiler sees its type
    for i, k in enumerate(kernels):
        descs = [
            f"etm::arg_desc<{p.type}>()"
            for p in sorted((p for p in k.params if p.buffer is not None), key=_by_buffer)
        ]
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) const unsigned long long '
            f"etm_msl_args_{i}[] = {{{', '.join(descs) or '0'}}};"
        )
    return "\n".join(lines) + "\n"


def _call(k: Kernel) -> str:
    """The kernel's call for the thread record ``t``, its arguments read from ``a``."""
    args = []
    for p in k.params:
        if p.position:
            fld, width = POSITION_FIELDS[p.position]
            src = f"t->{fld}" if width == 3 else f"&t->{fld}"
            args.append(f"etm::position<{p.type}>({src})")
        else:
            args.append(f"etm::buffer_arg<{p.type}>(a[{p.buffer}])")
    return f"{k.call}({', '.join(args)})"


def _by_buffer(p: Param) -> int:
    return p.buffer if p.buffer is not None else -1


def line_of(text: str, offset: int) -> tuple[str, int]:
    """(file, line) of ``offset`` in preprocessed text, from its line markers."""
    file, line = "", 1
    pos = 0
    for m in re.finditer(r'^# (\d+) "([^"]*)"[^\n]*\n', text[:offset], re.M):
        line_start = m.end()
        file, line = m.group(2), int(m.group(1))
        pos = line_start
    return file, line + text.count("\n", pos, offset)
