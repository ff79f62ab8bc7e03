"""The C++ of a split kernel (msl_split.py decides what it is; msl_split.h runs it).

``split_function`` writes ``NAME__etm_split(args, group)``: the kernel's buffer parameters
bound once, its threadgroup memory declared once, then per segment a region lambda run for
every thread (``etm_r{k}``: its position parameters bound from the thread record, the locals
kept at the cut before bound from that cut's struct, the statements, the struct of the locals
kept at the next cut returned), run in a loop, on fibers, or with a c10 reduction in lockstep.
"""

from __future__ import annotations

import re

from etmetal.shims.emulated_mps.msl_parse import POSITION_FIELDS, Kernel


def simd_wrapper(name: str, op: str) -> str:
    """The SIMD operation ``name`` calls, as it calls it (inserted after its definition, so
    the same overloads are visible), for tg_reduce."""
    if name.startswith("threadgroup_arg"):  # a (value, index) pair
        return (
            f"template <class V> inline auto {name}__etm_simd(V v) {{ return {op}(v.val, v.idx); }}"
        )
    return f"template <class D> inline D {name}__etm_simd(D v) {{ return D({op}(v)); }}"


def _lockstep_lines(k, prev, st, binds, bind_in, inp, call, last, live) -> list[str]:
    """A c10 reduction's statement with its lanes in lockstep: each thread's value and index
    in a loop, tg_reduce, then the statement with the call replaced by the thread's result; the
    statement on fibers (region ``etm_r{k}``, already written) if tg_reduce cannot run it."""
    qual, name, args = st.call
    arg_in = f", etm_c{prev}[i]" if prev is not None else ""
    lines = _sum_lines(k, st, binds, bind_in, inp, arg_in)
    text = re.sub(r"(?P<q>(?:::)?(?:\w+::)*)" + name + r"\s*\(.*\)(?=\s*;\s*$)",
                  f"(etm_y{k}[etm_t->index_in_tg])", st.text, count=1, flags=re.S)  # fmt: skip
    return lines + _finish_lines(k, st, binds, bind_in, inp, call, last, live, text)


def _sum_lines(k, st, binds, bind_in, inp, arg_in) -> list[str]:
    """threadgroup_sum/prod/max/min: each thread's (val, idx), then tg_reduce."""
    qual, name, (data, val, idx, size) = st.call
    d, a = f"etm_D{k}", f"etm::split::tg_arg<etm_D{k}>"
    return [
        f"using {d} = std::remove_cv_t<std::remove_reference_t<decltype(({data})[0])>>;",
        f"auto etm_a{k} = [&](const etm_msl_thread* etm_t{inp}) __attribute__((always_inline)) "
        f"{{ (void)etm_t; {binds} {bind_in} return {a}{{{d}({val}), unsigned({idx})}}; }};",
        f"{a}* etm_x{k} = etm::split::slots<{a}, {100 + k}>(etm_n);",
        _loop(f"new (&etm_x{k}[i]) {a}(etm_a{k}(etm_tt{arg_in}));"),
        f"{d}* etm_y{k} = etm::split::slots<{d}, {200 + k}>(etm_n);",
        f"auto etm_s{k} = []({d} v) __attribute__((always_inline)) {{ return {qual}{name}__etm_simd(v); }};",
        f"const bool etm_ok{k} = etm::split::tg_reduce<etm::split::{st.fold}>({data}, etm_x{k}, "
        f"etm_n, unsigned({size}), "
        f"etm_s{k}, etm_y{k});",
    ]


def _finish_lines(k, st, binds, bind_in, inp, call, last, live, text) -> list[str]:
    """The statement with the call replaced by each thread's result, in a loop; or, when the
    lockstep could not run it, the statement as written (``etm_r{k}``) on fibers."""
    lines = []
    out = "" if last else f"return etm_L{k}{{{', '.join(live[k])}}};"
    lines.append(
        f"auto etm_q{k} = [&](const etm_msl_thread* etm_t{inp}) __attribute__((always_inline)) "
        f"{{ (void)etm_t; {binds} {bind_in} {text} {out} }};"
    )
    qcall = call.replace(f"etm_r{k}(", f"etm_q{k}(")
    store = f"new (&etm_c{k}[i]) etm_L{k}({qcall});" if not last else f"{qcall};"
    fcall = call.replace("etm_tt", "etm_t").replace("[i]", "[etm_t->index_in_tg]")
    fstore = f"new (&etm_c{k}[etm_t->index_in_tg]) etm_L{k}({fcall});" if not last else f"{fcall};"
    lines += [
        f"if (etm_ok{k}) {{",
        _loop(store),
        f"}} else {{ auto etm_f{k} = [&](const etm_msl_thread* etm_t) {{ {fstore} }};",
        f"etm::split::fibers(etm_g, etm_f{k}); }}",
    ]
    return lines


# thread-position attributes every thread of a threadgroup shares
UNIFORM_POSITIONS = frozenset(
    [
        "threadgroup_position_in_grid", "threads_per_threadgroup",
        "dispatch_threads_per_threadgroup", "threads_per_grid", "threadgroups_per_grid",
        "simdgroups_per_threadgroup", "threads_per_simdgroup", "thread_execution_width",
        "dispatch_simdgroups_per_threadgroup", "quadgroups_per_threadgroup",
    ]
)  # fmt: skip


def _bindings(kernel: Kernel, positions: bool) -> str:
    """The kernel's parameters bound from the thread record ``etm_t`` (positions), or once per
    threadgroup: buffers from the arguments ``etm_a``, the shared positions from the group
    ``etm_g`` (every name the generated code adds starts with ``etm_``: a kernel's own names,
    say a local ``t``, cannot collide)."""
    out = []
    for p in kernel.params:
        if p.position and (positions or p.position in UNIFORM_POSITIONS):
            fld, width = POSITION_FIELDS[p.position]
            rec = "etm_t" if positions else "etm_g"
            src = f"{rec}->{fld}" if width == 3 else f"&{rec}->{fld}"
            out.append(f"{p.type} {p.name} = etm::position<{p.type}>({src});")
        elif not p.position and not positions:
            out.append(f"{p.type} {p.name} = etm::buffer_arg<{p.type}>(etm_a[{p.buffer}]);")
    return " ".join(out)


def _loop(store: str) -> str:
    """``store`` (naming the thread record ``etm_tt`` and its index ``i``) for every thread
    of the threadgroup, in thread_index_in_threadgroup order (msl_split.h's ``each``)."""
    return (
        "etm::split::each(etm_g, [&](const etm_msl_thread* etm_tt, uint32_t i) "
        f"__attribute__((always_inline)) {{ (void)etm_tt; (void)i; {store} }});"
    )


# `threadgroup T name[N]...;` with one declarator: the array is `static thread_local` (one per
# OS thread, msl_parse.py), which a dlopen'ed library reaches through __tls_get_addr at every
# use; a local reference taken once per threadgroup makes the regions' accesses plain loads
_TG_DECL = re.compile(
    r"^\s*threadgroup\s+([\w:<>, ]+?)\s+(\w+)\s*((?:\[[^\[\]]+\])+)\s*;\s*$", re.S
)


def _threadgroup_decl(text: str) -> str:
    m = _TG_DECL.match(text)
    if m is None:
        return text
    ty, name, dims = m.groups()
    return f"threadgroup {ty} etm_tg_{name}{dims}; auto& {name} = etm_tg_{name};"


def split_function(kernel, sts, segments, live, shared, helpers, batch=None) -> str:
    """The split function; with ``batch`` (msl_split.py's ``_batch_plan``: the one uniform
    statement, its threadgroup array and size) also ``NAME__etm_batch`` (below)."""
    code = _split_body(kernel, sts, segments, live, shared, helpers, None)
    if batch is None:
        return code
    return "\n".join(
        [
            code,
            _split_body(kernel, sts, segments, live, shared, helpers, batch),
            _batch(kernel, batch),
        ]
    )


def _batch_arrays(kernel, sts) -> list[tuple[str, str, str]]:
    """(type, name, dims) of the kernel's threadgroup arrays (each a plain declaration)."""
    return [_TG_DECL.match(st.text).groups() for st in sts if st.threadgroup]


def _batch(kernel, batch) -> str:
    """``NAME__etm_batch(args, groups, k)``: up to ETM_MSL_BATCH threadgroups at once. Each
    runs its regions up to the uniform statement (its own threadgroup memory and kept locals),
    the c10 reduction runs for all of them interleaved (msl_split.h), then each runs the rest.
    Metal gives threadgroups no order, so this order is as exact as one after another."""
    name = re.sub(r".*::", "", kernel.call)
    _st, array, size, fn = batch
    return "\n".join(
        [
            f"void {name}__etm_batch(void* const* etm_a, const etm_msl_thread* etm_gs, "
            "uint32_t etm_k) {",
            f"for (uint32_t b = 0; b < etm_k; b++) {name}__etm_part(etm_a, etm_gs + b, b, 0, nullptr);",
            "float3 etm_u[etm::split::kBatch];",
            f"etm::split::{fn}_batch(etm_tgb_{name}_{array}, etm_k, unsigned({size}), etm_u);",
            f"for (uint32_t b = 0; b < etm_k; b++) {name}__etm_part(etm_a, etm_gs + b, b, 1, etm_u);",
            "}",
        ]
    )


def _split_body(kernel, sts, segments, live, shared, helpers, batch) -> str:
    """The split function, or with ``batch`` the part of it one threadgroup of a batch runs:
    part 0 up to the uniform statement, part 1 from it (given its value in ``etm_u``)."""
    name = re.sub(r".*::", "", kernel.call)
    binds = _bindings(kernel, positions=True)
    if batch is None:
        lines = [f"void {name}__etm_split(void* const* etm_a, const etm_msl_thread* etm_g) {{"]
        lines.append(_bindings(kernel, positions=False))
        lines += [_threadgroup_decl(st.text) for st in sts if st.threadgroup]  # once
        # a uniform early return (msl_split.py's _uniform_exit): tested once, before all
        lines += [
            "{ " + " ".join(st.exit_deps) + f" {st.text} }}" for st in sts if st.kind == "exit"
        ]
    else:
        # threadgroup memory per batch slot, outside the function so the batch reaches it
        lines = [
            f"threadgroup {ty} etm_tgb_{name}_{arr}[etm::split::kBatch]{dims};"
            for ty, arr, dims in _batch_arrays(kernel, sts)
        ]
        lines.append(
            f"static void {name}__etm_part(void* const* etm_a, const etm_msl_thread* etm_g, "
            "uint32_t etm_b, int etm_part, const float3* etm_u) {"
        )
        lines.append(_bindings(kernel, positions=False))
        lines += [
            f"auto& {arr} = etm_tgb_{name}_{arr}[etm_b];"
            for _, arr, _ in _batch_arrays(kernel, sts)
        ]
    lines.append("const uint32_t etm_n = etm::split::count(etm_g);")
    if batch is not None:
        # each slot's kept locals apart: a threadgroup has at most the dispatch's group size
        lines.append(
            "const uint32_t etm_stride = etm_g->dispatch_tg_size[0] * etm_g->dispatch_tg_size[1]"
            " * etm_g->dispatch_tg_size[2];"
        )
    before = batch is not None  # part 0's segments: before the uniform statement
    prev = None  # the cut before the current segment
    for k, seg in enumerate(segments):
        text = " ".join(st.text for st in seg)
        for h in helpers:
            text = re.sub(rf"\b{h}\b(?=\s*\()", f"{h}__etm_u", text)
        if seg[0].kind == "uniform" and seg[0].declares in shared:
            if batch is not None and seg[0] is batch[0]:
                lines.append("if (etm_part == 0) return;")
                before = False
                text = re.sub(r"=.*;\s*$", "= etm_u[etm_b];", text, count=1, flags=re.S)
            lines.append(re.sub(r"^\s*(?:const\s+)?", "const ", text, count=1))
            continue
        last = k == len(segments) - 1
        inp = f", etm_L{prev}& etm_in" if prev is not None else ""
        bind_in = (
            f"auto& [{', '.join(live[prev])}] = etm_in;" if prev is not None and live[prev] else ""
        )
        out = ""
        if not last:
            # bound by position (structured bindings): members named apart from the locals
            members = " ".join(f"decltype({n}) etm_m{j};" for j, n in enumerate(live[k]))
            out = f"struct etm_live {{ {members} }}; return etm_live{{{', '.join(live[k])}}};"
        lines.append(
            f"auto etm_r{k} = [&](const etm_msl_thread* etm_t{inp}) __attribute__((always_inline)) "
            f"{{ (void)etm_t; {binds} {bind_in} {text} {out} }};"
        )
        arg_in = f", etm_c{prev}[i]" if prev is not None else ""
        call = f"etm_r{k}(etm_tt{arg_in})"
        if not last:
            sample = f"etm_r{k}(etm_g{', *etm_c' + str(prev) if prev is not None else ''})"
            lines.append(f"using etm_L{k} = decltype({sample});")
            if batch is None:
                lines.append(f"etm_L{k}* etm_c{k} = etm::split::slots<etm_L{k}, {k}>(etm_n);")
            else:
                lines.append(
                    f"etm_L{k}* etm_c{k} = etm::split::slots<etm_L{k}, {k}>(etm_stride * "
                    "etm::split::kBatch) + etm_b * etm_stride;"
                )
        if seg[0].kind == "lockstep":
            lines += _lockstep_lines(k, prev, seg[0], binds, bind_in, inp, call, last, live)
        elif seg[0].kind == "fibers":
            fcall = call.replace("etm_tt", "etm_t").replace("[i]", "[etm_t->index_in_tg]")
            store = (
                f"new (&etm_c{k}[etm_t->index_in_tg]) etm_L{k}({fcall});"
                if not last
                else f"{fcall};"
            )
            lines.append(f"auto etm_f{k} = [&](const etm_msl_thread* etm_t) {{ {store} }};")
            lines.append(f"etm::split::fibers(etm_g, etm_f{k});")
        else:
            store = f"new (&etm_c{k}[i]) etm_L{k}({call});" if not last else f"{call};"
            lines.append(("if (etm_part == 0) " if before else "") + _loop(store))
        if not last:
            prev = k
    lines.append("}")
    return "\n".join(lines)
