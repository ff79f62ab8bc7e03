"""Split a synchronising kernel at its top-level barriers (PoCL's regions), decided per kernel.

A kernel whose body is a sequence of top-level statements, some of which synchronise, gets a
*split entry* (``msl_split.h``): every run of statements that do not synchronise is a region,
one loop over the threadgroup's threads; a thread's locals used after a cut travel to the next
region in a per-thread struct. The synchronising statements become:

- ``threadgroup_barrier(...);`` at the top level: only the cut between two regions (every
  thread finished the one before when any starts the next: the barrier's meaning);
- a call of a *uniform helper*: a function whose barriers stand at its own top level and which
  writes no memory and makes no SIMD-group operation (c10's ``threadgroup_welford_reduce`` and
  ``threadgroup_welford_combine``). All its reads happen between the region that wrote the
  threadgroup memory and the next, so its barriers are already kept: it runs, as a copy with
  them removed, in a loop; and once per threadgroup when its arguments are the same for every
  thread (threadgroup arrays, buffers and literals), its value shared;
- anything else (SIMD-group operations, c10's ``threadgroup_sum``, a barrier under control flow)
  runs for every thread at once on the dispatcher's fibers, with Metal's semantics, between
  the regions.

A kernel the splitter cannot keep exact stays on fibers, with the reason recorded
(``Kernel.path_reason``): a ``return`` before the last synchronising statement (a thread that
leaves must leave every region after it), a kept local that is an array or a reference, a
parameter assigned, a declaration of several names, a template kernel. Should the split code
not compile, the library is built again without it (``msl_compiler``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from etmetal.shims.emulated_mps.msl_classify import _ROOTS, _matching_back, function_bodies
from etmetal.shims.emulated_mps.msl_parse import Kernel, _matching, _split_top
from etmetal.shims.emulated_mps.msl_split_emit import (
    UNIFORM_POSITIONS,
    simd_wrapper,
    split_function,
)

_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_BARRIER_STMT = re.compile(r"^(?:::)?(?:metal::)?threadgroup_barrier\s*\([^;]*\)\s*;$", re.S)
_BARRIER_CALL = re.compile(r"(?:::)?(?:metal::)?\bthreadgroup_barrier\s*\(")
_BLOCK_STARTS = ("if", "for", "while", "switch", "do", "else", "try")
_REFUSED_STARTS = ("using", "typedef", "goto", "case", "default", "struct", "class", "enum")
_DECL_WORDS = {"const", "constexpr", "volatile", "unsigned", "signed", "static", "thread_local"}
_NOT_TYPES = {"return", "delete", "throw", "co_return", "else", "new", "sizeof"}
# a declaration's head: a type (words, ::, template arguments, * and &) then the name
_DECL = re.compile(
    r"^(?P<type>(?:[A-Za-z_][\w:]*(?:\s*<[^;{}]*>)?[\s*&]+)+?)(?P<name>[A-Za-z_]\w*)\s*"
    r"(?P<after>=(?!=)|;|\[|\{|\()",
    re.S,
)
# c10's threadgroup reductions run with the SIMD lanes in lockstep (msl_split.h's tg_reduce):
# helper -> (the SIMD operation it calls, digests of the bodies tg_reduce follows). A helper
# whose text differs (another torch) is not recognised and its statement runs on fibers.
LOCKSTEP = {
    "threadgroup_sum": ("simd_sum", {"f4c78ec2ebe9ea38"}),
    "threadgroup_prod": ("simd_prod", {"eb91526bb8be4022"}),
    "threadgroup_max": ("simd_max", {"11157ee8b2e093d5"}),
    "threadgroup_min": ("simd_min", {"7af72b68edbf8bec"}),
}
# c10's SIMD reductions whose value tg_reduce computes at once for a float (msl_split.h's
# fold_*) instead of replaying them: the digests of every definition of the name in the
# library (c10's overloads and msl_sync.h's own), as this torch has them
FOLDS = {
    "simd_sum": (
        "fold_sum",
        {"02cb129ab03ee4e7", "20584c28b9307d7f", "4766a60aed20f7e6", "967f2f3bb305c3f4"},
    ),
    "simd_max": (
        "fold_max",
        {"094e2089c7de0f57", "6cf3bbb117dbb151", "86aa436e689b3998", "e3c53b9a2e27bc73"},
    ),
    "simd_min": (
        "fold_min",
        {"4e5514b03fda1359", "61ea0b9236d614f9", "65f6ebeb8aeed59a", "c0e56fdc92d8b41b"},
    ),
}
# c10's helpers whose threadgroups a batch entry runs together (msl_split.h's NAME_batch),
# recognised by the digest of their text like LOCKSTEP's
BATCHED = {"threadgroup_welford_reduce": {"2b4bf7821372b73d"}}
# a threadgroup array a batch can give each threadgroup its own copy of
_TG_ARRAY_1D = re.compile(r"^\s*threadgroup\s+[\w:]+\s+\w+\s*\[\s*\d+u?\s*\]\s*;\s*$")
# an assignment (or ++/--) whose target ends in `name`, a member or a subscript of it
_ASSIGN_OPS = r"(?:=(?!=)|[-+*/%&|^]=|<<=|>>=|\+\+|--)"


@dataclass
class Statement:
    text: str
    sync: bool = False
    declares: str | None = None  # the one name a declaration introduces
    decl_type: str = ""
    array: bool = False  # declares an array
    threadgroup: bool = False  # threadgroup memory: one per threadgroup, hoisted
    kind: str = "plain"  # plain, barrier, uniform (a uniform helper), lockstep, fibers
    call: tuple[str, str, list[str]] = ("", "", [])  # lockstep: qualifier, helper, arguments
    fold: str = "fold_none"  # lockstep: how tg_reduce computes its SIMD operation (FOLDS)
    exit_deps: list[str] = field(default_factory=list)  # exit: the declarations it reads


@dataclass
class SplitPlan:
    path: str  # "split" or "fibers"
    reason: str = ""
    code: str = ""  # the split function (after the kernel's definition)
    helpers: dict[str, str] = field(default_factory=dict)  # helper name -> its uniform copy
    lockstep: set[str] = field(default_factory=set)  # c10 reductions it runs in lockstep
    batch: bool = False  # also a batch entry (BATCHED)


def statements(body: str) -> list[str]:
    """The top-level statements of a function body (without its braces)."""
    out, cur_start, depth, i, n = [], 0, 0, 0, len(body)
    while i < n:
        c = body[i]
        if c in "\"'":
            j = i + 1
            while j < n and body[j] != c:
                j += 2 if body[j] == "\\" else 1
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if c == "}" and depth == 0:
                head = body[cur_start:i].lstrip()
                word = _IDENT.match(head)
                block = head.startswith("{") or (word and word.group(0) in _BLOCK_STARTS)
                if block and not (word and word.group(0) == "do"):
                    rest = body[i + 1 :].lstrip()
                    if not re.match(r"else\b", rest):
                        out.append(body[cur_start : i + 1].strip())
                        cur_start = i + 1
        elif c == ";" and depth == 0:
            out.append(body[cur_start : i + 1].strip())
            cur_start = i + 1
        i += 1
    tail = body[cur_start:].strip()
    if tail:
        out.append(tail)
    merged: list[str] = []
    for s in out:  # `if (c) x; else y;`: the else joins its if
        if merged and re.match(r"else\b", s):
            merged[-1] += " " + s
        elif s:
            merged.append(s)
    return merged


def _declaration(st: Statement) -> str | None:
    """Fill in what a declaration statement declares; a reason it cannot be split, or None."""
    text = st.text
    word = _IDENT.match(text)
    if word and word.group(0) in _REFUSED_STARTS:
        return f"a '{word.group(0)}' statement in the kernel body"
    if re.match(r"auto\s*&*\s*\[", text):
        return "a structured binding in the kernel body"
    m = _DECL.match(text)
    if not m:
        return None
    words = _IDENT.findall(m.group("type"))
    if not words or words[0] in _NOT_TYPES or words[0] in _BLOCK_STARTS:
        return None
    st.threadgroup = "threadgroup" in words and "*" not in m.group("type")
    st.declares = m.group("name")
    st.decl_type = m.group("type").strip()
    st.array = m.group("after") == "["
    init = text[m.end() - 1 :]
    if len(_split_top(init.rstrip(";"))) > 1 and not st.threadgroup:  # hoisted whole otherwise
        return f"the declaration '{text[:60]}' declares several names"
    return None


def _assigned(name: str, text: str, subscripts: bool = True) -> bool:
    """Whether ``text`` assigns ``name``, a member of it or (with ``subscripts``) an element."""
    parts = r"\.\s*\w+|\[[^\]]*\]" if subscripts else r"\.\s*\w+"
    pat = rf"(?<![\w.])\b{name}\b(?:\s*(?:{parts}))*\s*{_ASSIGN_OPS}"
    return re.search(pat, text) is not None or re.search(rf"(?:\+\+|--)\s*{name}\b", text)


def _brace_depth_at(text: str, pos: int) -> int:
    return text.count("{", 0, pos) - text.count("}", 0, pos)


def uniform_copy(name: str, text: str, bodies: dict, tainted: set[str]) -> list[tuple[int, str]]:
    """For a helper every definition of which is uniform, (insertion offset, copy with its
    barriers removed, named ``name__etm_u``) per definition; [] when one is not."""
    copies = []
    for start, end in bodies.get(name, []):
        body = text[start : end + 1]
        if _ROOTS.search(re.sub(r"threadgroup_barrier", "", body)) or "atomic" in body:
            return []  # SIMD-group operations, or memory others may see changed
        if any(w in tainted and w != name for w in _IDENT.findall(body)):
            return []  # a call of something else that synchronises
        for m in _BARRIER_CALL.finditer(body):
            if _brace_depth_at(body, m.start()) != 1:
                return []  # a barrier under control flow
        # the parameters: memory (pointers, references) must only be read
        close = text.rfind(")", 0, start)
        open_ = _matching_back(text, close)
        if open_ < 0:
            return []
        params = [p.strip() for p in _split_top(text[open_ + 1 : close])]
        memory = [
            pm.group(1)
            for p in params
            if ("*" in p or "&" in p) and (pm := re.search(r"([A-Za-z_]\w*)\s*$", p))
        ]
        inner = body[1:-1]
        for mem in memory:
            if _assigned(mem, inner) or re.search(rf"\b{mem}\b(?!\s*\[)", inner):
                return []  # written, or passed on / used as a pointer
        if re.search(rf"(\]|\)|\*\s*\w+|->\s*\w+)\s*{_ASSIGN_OPS}", inner):
            return []  # a write through a subscript, a dereference or a member of a pointer
        # where the definition starts: after the previous ; { or } outside parentheses
        j, depth = open_ - 1, 0
        while j >= 0:
            c = text[j]
            if c in ")>":
                depth += 1
            elif c in "(<":
                depth -= 1
            elif depth <= 0 and c in ";{}":
                break
            j -= 1
        head = text[j + 1 : open_]
        nm = list(re.finditer(rf"\b{name}\b", head))
        if not nm:
            return []
        cut = nm[-1].start()
        copy = (
            head[:cut]
            + f"{name}__etm_u"
            + head[nm[-1].end() :]
            + text[open_:start]
            + _BARRIER_CALL.sub("etm_msl_no_barrier(", body)
        )
        copies.append((end + 1, copy))
    return copies


def plan(kernel: Kernel, text: str, tainted: set[str], bodies: dict | None = None) -> SplitPlan:
    """How ``kernel`` (a synchronising kernel of the preprocessed ``text``) runs."""
    if "<" in kernel.call:
        return SplitPlan("fibers", "a template kernel")
    km = re.compile(r"\bkernel\s+void\b").search(text, kernel.start)
    paren = text.find("(", km.end()) if km else -1
    close = _matching(text, paren, "(", ")") if paren >= 0 else -1
    open_ = text.find("{", close) if close >= 0 else -1
    if open_ < 0 or open_ >= kernel.end:
        return SplitPlan("fibers", "cannot read the kernel body")
    body = text[open_ + 1 : kernel.end - 1]
    if "\n#" in body:
        return SplitPlan("fibers", "a preprocessor line marker inside the kernel body")
    bodies = function_bodies(text) if bodies is None else bodies
    sts = [Statement(s) for s in statements(body)]
    for st in sts:
        reason = _declaration(st)
        if reason:
            return SplitPlan("fibers", reason)
        words = set(_IDENT.findall(st.text))
        st.sync = bool(_ROOTS.search(st.text)) or not words.isdisjoint(tainted)
    if any(re.search(r"\[\s*[&=]", st.text) for st in sts):
        return SplitPlan(
            "fibers", "a lambda in the kernel body (its captures could outlive a region)"
        )
    if not any(st.sync for st in sts):
        return SplitPlan("fibers", "no top-level statement synchronises")
    params = {p.name for p in kernel.params}
    for pn in params:
        if _assigned(pn, body, subscripts=False):
            return SplitPlan("fibers", f"the parameter '{pn}' is assigned")
    last_sync = max(i for i, st in enumerate(sts) if st.sync)
    first_sync = min(i for i, st in enumerate(sts) if st.sync)
    for i, st in enumerate(sts[:last_sync]):
        if re.search(r"\breturn\b", st.text):
            if i < first_sync and _uniform_exit(st, sts[:i], kernel):
                st.kind = "exit"  # every thread or none: once per threadgroup, before all
                continue
            return SplitPlan("fibers", f"a return before a barrier (statement {i + 1})")
    locals_ = {st.declares for st in sts if st.declares and not st.threadgroup}
    # positions that differ between the threads of a threadgroup
    positions = {
        p.name for p in kernel.params if p.position and p.position not in UNIFORM_POSITIONS
    }
    helpers: dict[str, str] = {}
    lockstep: set[str] = set()
    fiber_notes = []
    shared: set[str] = set()  # uniform values: one per threadgroup, at the group's scope
    for i, st in enumerate(sts):
        if not st.sync:
            continue
        if st.threadgroup or st.array:
            return SplitPlan("fibers", f"statement {i + 1} declares memory and synchronises")
        if _BARRIER_STMT.match(st.text):
            st.kind = "barrier"
            continue
        whole = re.fullmatch(
            r"(?:[^=;]*?=)?\s*(?P<qual>(?:::)?(?:\w+::)*)([A-Za-z_]\w*)\s*\((?P<args>.*)\)\s*;",
            st.text,
            re.S,
        )
        name = whole.group(2) if whole else ""
        if whole and _lockstep_call(st, whole, name, text, bodies, locals_ | positions):
            st.kind = "lockstep"
            lockstep.add(name)
            continue
        if whole and name in tainted and name not in helpers:
            copies = uniform_copy(name, text, bodies, tainted)
            if copies:
                helpers[name] = "".join(c for _, c in copies)
        if whole and name in helpers and not _ROOTS.search(whole.group("args")):
            st.kind = "uniform"
            args = set(_IDENT.findall(whole.group("args")))
            later = " ".join(s.text for s in sts[i + 1 :])
            if (
                st.declares
                and args.isdisjoint(locals_ | positions)
                and "&" not in st.decl_type
                and not _assigned(st.declares, later)
            ):
                shared.add(st.declares)
            continue
        st.kind = "fibers"
        fiber_notes.append(f"statement {i + 1} ({st.text[:40].strip()}...) on fibers")
    if all(st.kind == "fibers" for st in sts if st.sync):
        # nothing to gain: the fiber phases would cost what whole-kernel fibers cost, and more
        return SplitPlan(
            "fibers", "every synchronising statement needs fibers: " + "; ".join(fiber_notes)
        )
    # the live locals at each cut, and the regions between
    segments: list[list[Statement]] = [[]]
    for st in sts:
        if st.threadgroup or st.kind == "exit":
            continue  # hoisted
        if st.kind == "plain":
            segments[-1].append(st)
            continue
        if segments[-1] or len(segments) == 1:
            segments.append([])
        if st.kind != "barrier":
            segments[-1].append(st)
            segments.append([])
    segments = [s for s in segments if s]
    declared: list[set[str]] = []
    seen: set[str] = set()
    for seg in segments:
        seen |= {st.declares for st in seg if st.declares and st.declares not in shared}
        declared.append(set(seen))
    used_after = [set() for _ in segments]
    acc: set[str] = set()
    for k in range(len(segments) - 1, -1, -1):
        used_after[k] = set(acc)
        for st in segments[k]:
            acc |= set(_IDENT.findall(st.text))
    decls = {st.declares: st for st in sts if st.declares}
    live = [sorted(declared[k] & used_after[k]) for k in range(len(segments))]
    for names in live:
        for n in names:
            d = decls[n]
            # the address of a local would point into the region that ended
            address_of = set(re.findall(r"(?:^|[=(,?:])\s*&\s*([A-Za-z_]\w*)", d.text)) & locals_
            if address_of:
                return SplitPlan("fibers", f"the local '{n}' lives across a barrier and holds "
                                 f"the address of the local '{sorted(address_of)[0]}'")  # fmt: skip
            if d.array or "&" in d.decl_type:
                return SplitPlan("fibers", f"the local '{n}' lives across a barrier and is an "
                                 "array or a reference")  # fmt: skip
    batch = _batch_plan(sts, shared, text, bodies)
    code = split_function(kernel, sts, segments, live, shared, helpers, batch)
    reason = "; ".join(fiber_notes)
    return SplitPlan("split", reason, code, helpers, lockstep, batch is not None)


_EXIT = re.compile(r"if\s*\((?P<cond>[^;{}]*)\)\s*(?:return\s*;|\{\s*return\s*;\s*\})", re.S)
_SIDE_EFFECT = re.compile(r"(?<![=!<>])=(?!=)|\+\+|--|[-+*/%&|^]=|<<=|>>=")
# words of an expression that name no value: keywords, types, casts
_NOT_VALUES = {
    "auto", "const", "int", "uint", "long", "ulong", "short", "ushort", "char", "uchar", "bool",
    "float", "half", "bfloat", "unsigned", "signed", "static_cast", "true", "false", "size_t",
}  # fmt: skip


def _values(expr: str) -> set[str]:
    """The names an expression reads: not its calls' and namespaces' names, not members."""
    expr = re.sub(r"\b[A-Za-z_]\w*\s*(?=\(|::)", " ", expr)  # calls and qualifiers
    expr = re.sub(r"\.\s*[A-Za-z_]\w*", " ", expr)  # .member
    expr = re.sub(r"\b\d[\w.]*", " ", expr)  # literals (1e-05f, 0x1f)
    return set(_IDENT.findall(expr)) - _NOT_VALUES


def _uniform_exit(st: Statement, before: list[Statement], kernel: Kernel) -> bool:
    """Whether ``st`` is ``if (cond) return;`` whose condition is the same for every thread of
    a threadgroup and can be tested before anything else: every statement before it declares a
    local without any other effect, and the condition reads only read-only buffers, uniform
    positions and locals computed from those (Inductor's bounds test of an embedding index).
    Every thread then returns or none does, which one test per threadgroup decides."""
    m = _EXIT.fullmatch(st.text.strip())
    if m is None or _SIDE_EFFECT.search(m.group("cond")):
        return False
    uniform = {
        p.name
        for p in kernel.params
        if (p.buffer is not None and re.match(r"\s*const\b", p.type) and "*" in p.type)
        or p.position in UNIFORM_POSITIONS
    }
    decls: dict[str, Statement] = {}
    for b in before:
        if b.threadgroup:
            continue
        if not b.declares or b.array or "=" not in b.text:
            return False
        init = b.text[b.text.index("=") + 1 :]
        if _SIDE_EFFECT.search(init):
            return False  # an assignment or increment: an effect the test would skip
        decls[b.declares] = b
        if _values(init) <= uniform:
            uniform.add(b.declares)
    needed = _values(m.group("cond"))
    if not needed <= uniform:
        return False
    deps: list[str] = []
    todo = [n for n in needed if n in decls]
    while todo:
        n = todo.pop()
        if n in deps:
            continue
        deps.append(n)
        init = decls[n].text[decls[n].text.index("=") + 1 :]
        todo += [v for v in _values(init) if v in decls]
    st.exit_deps = [b.text for b in before if b.declares in deps]
    return True


def _batch_plan(sts: list[Statement], shared: set[str], text: str, bodies: dict):
    """(statement, array, size, helper) when the kernel's one synchronising statement other
    than barriers is a shared call of a BATCHED helper over one of its threadgroup arrays
    with a literal size, every threadgroup array a plain one-dimensional declaration; else
    None (the kernel runs one threadgroup at a time)."""
    syncs = [st for st in sts if st.sync and st.kind != "barrier"]
    if (
        any(st.kind == "exit" for st in sts)
        or len(syncs) != 1
        or syncs[0].kind != "uniform"
        or syncs[0].declares not in shared
    ):
        return None
    st = syncs[0]
    m = re.fullmatch(r"[^=;]*=\s*(?:::)?(?:\w+::)*(\w+)\s*\((?P<args>.*)\)\s*;", st.text, re.S)
    if m is None or m.group(1) not in BATCHED:
        return None
    name = m.group(1)
    defs = bodies.get(name, [])
    if not defs or any(_digest(text[a : b + 1]) not in BATCHED[name] for a, b in defs):
        return None
    args = [x.strip() for x in _split_top(m.group("args"))]
    arrays = [s for s in sts if s.threadgroup]
    if len(args) != 2 or not re.fullmatch(r"\d+u?", args[1]):
        return None
    if args[0] not in {s.declares for s in arrays} or not all(
        _TG_ARRAY_1D.match(s.text) for s in arrays
    ):
        return None
    return st, args[0], args[1], name


def _digest(body: str) -> str:
    return hashlib.sha256(re.sub(r"\s+", " ", body).encode()).hexdigest()[:16]


def _lockstep_call(st: Statement, whole: re.Match, name: str, text, bodies, varying) -> bool:
    """Whether ``st`` calls a recognised c10 reduction that tg_reduce can run: every definition
    of it is the known text, its data array and size are the same for every thread, and the
    value and index have no effects (they are evaluated once more should it fall back)."""
    if name not in LOCKSTEP or (st.declares and (st.array or "&" in st.decl_type)):
        return False
    defs = bodies.get(name, [])
    if not defs or any(_digest(text[a : b + 1]) not in LOCKSTEP[name][1] for a, b in defs):
        return False
    args = [x.strip() for x in _split_top(whole.group("args"))]
    if len(args) != 4:
        return False
    data, val, idx, size = args
    if not set(_IDENT.findall(data + " " + size)).isdisjoint(varying):
        return False
    if any(re.search(_ASSIGN_OPS, x) for x in (val, idx)) or not re.fullmatch(r"[\w:.]+", data):
        return False
    st.call = (whole.group("qual"), name, args)
    op = LOCKSTEP[name][0]
    if op in FOLDS:
        op_defs = bodies.get(op, [])
        if op_defs and all(_digest(text[a : b + 1]) in FOLDS[op][1] for a, b in op_defs):
            st.fold = FOLDS[op][0]
    return True


def apply(text: str, kernels: list[Kernel], tainted: set[str]) -> str:
    """Decide each kernel's path (``Kernel.path``, ``Kernel.path_reason``) and return ``text``
    with the split functions (after their kernels) and the uniform helpers' copies (after the
    helpers) inserted, each followed by a line marker that restores the text's own lines."""
    from etmetal.shims.emulated_mps.msl_parse import line_of

    bodies = function_bodies(text)
    inserts: dict[int, str] = {}
    copied: set[str] = set()
    for k in kernels:
        if not k.sync:
            k.path, k.path_reason = "loop", ""
            continue
        p = plan(k, text, tainted, bodies)
        k.path, k.path_reason = p.path, p.reason
        k.batch = p.batch
        if p.path != "split":
            continue
        inserts[k.end] = inserts.get(k.end, "") + p.code + "\n"
        for name in p.lockstep:
            if name in copied:
                continue
            copied.add(name)
            _, end = bodies[name][0]
            inserts[end + 1] = (
                inserts.get(end + 1, "") + simd_wrapper(name, LOCKSTEP[name][0]) + "\n"
            )
        for name in p.helpers:
            if name in copied:
                continue
            copied.add(name)
            for pos, copy in uniform_copy(name, text, bodies, tainted):
                inserts[pos] = inserts.get(pos, "") + copy + "\n"
    out, last = [], 0
    for pos in sorted(inserts):
        file, line = line_of(text, pos)
        out.append(text[last:pos])
        out.append(f'\n# 1 "<etmetal split kernels>"\n{inserts[pos]}# {line} "{file}"\n')
        last = pos
    out.append(text[last:])
    return "".join(out)
