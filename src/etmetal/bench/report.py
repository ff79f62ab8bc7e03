"""Render the JSON of ``etmetal bench all`` as BENCHMARKS.md (numbers only from the JSON)."""

from __future__ import annotations

from typing import Any

_METHOD = """\
Every comparison runs its arms in turns (A, B, C, A, B, C, ...) after a warm-up, so
load drifts on this shared machine hit all arms alike; each cell is the **median**
per call (several calls per sample for short calls), and each ratio is a ratio of
medians. Every arm uses the same intra-op thread count. Before timing, every arm's
output is checked against eager PyTorch (the suite aborts if one differs). Each suite
runs in its own process. Nothing here is edited by hand: the file is the output of
the command below."""


def _us(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} us"


def _num(v: float) -> str:
    return f"{v:.3f}" if abs(v) >= 0.01 else f"{v:.2e}"


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "**missed**")


def _ratio_table(rows: list[dict], lines: list[str]) -> None:
    arms: list[str] = []
    for r in rows:
        arms += [a for a in r["median_us"] if a not in arms]
    lines.append("| case | " + " | ".join(arms) + " | ratio | target | |")
    lines.append("|---" * (len(arms) + 4) + "|")
    for r in rows:
        cells = [_us(r["median_us"][a]) if a in r["median_us"] else "" for a in arms]
        ratios = list(r["ratios"].items()) or [("", None)]
        for i, (k, v) in enumerate(ratios):
            lim = r["targets_at_most"].get(k)
            ok = r["met"].get(k)
            head = f"{r['case']}" + (
                f" ({r['extra']['description']})"
                if "extra" in r and "description" in r["extra"]
                else ""
            )
            row = [head if i == 0 else ""] + (cells if i == 0 else [""] * len(arms))
            row += [
                f"{k} = {v:.3f}" if v is not None else "",
                f"<= {lim}" if lim else "",
                _verdict(ok),
            ]
            lines.append("| " + " | ".join(row) + " |")


def _runtime_extra(rows: list[dict], lines: list[str]) -> None:
    for r in rows:
        err = r.get("extra", {}).get("etmetal_error")
        if err:
            lines.append("")
            lines.append(f"{r['case']}: **etmetal.runtime could not run this .pte**: `{err}`")
    for r in rows:
        if r["case"] == "loop_overhead":
            e = r["extra"]
            per = e["us_per_instruction"]
            lines.append("")
            lines.append(
                f"Loop overhead ({e['description']}, {e['instructions']} instructions): "
                f"etmetal {per['etmetal']:.2f} us/instruction, stock C++ runtime "
                f"{per['stock']:.2f} us, the same ATen out-variant calls from a Python loop "
                f"{per['aten_calls']:.2f} us (etmetal minus that loop, paired median: "
                f"{e['etmetal_minus_python_loop_us_per_instruction']:.2f} us). etmetal's own loop "
                f"overhead, measured by running the same method with every kernel step replaced "
                f"by a no-op (includes the per-execute input copy and output clone): "
                f"**{e['etmetal_overhead_us_per_instruction']:.2f} us/instruction** "
                f"(target < {e['target_us_per_instruction']} us: "
                f"{_verdict(e['met_overhead'])}); total per instruction "
                f"{_verdict(e['met_us_per_instruction'])} against the same bound."
            )


def _overhead(rows: list[dict], lines: list[str]) -> None:
    for r in rows:
        e = r["extra"]
        if r["case"] == "shim_calls":
            lines.append(f"ns per shim call, timed from native code ({e['note']}):")
            lines.append("")
            lines.append("| call pattern | ns/call | target < 2000 ns |")
            lines.append("|---|---|---|")
            for k, v in e["ns_per_call"].items():
                lines.append(f"| {k} | {v:.0f} | {_verdict(e['met'][k])} |")
            lines.append("")
    lines.append("Copy bandwidth vs a contiguous copy of the same bytes (target >= 0.5):")
    lines.append("")
    lines.append("| size | kind | GB/s | ratio to contiguous copy | |")
    lines.append("|---|---|---|---|---|")
    for r in rows:
        e = r["extra"]
        if r["case"].startswith("copy_"):
            size = r["case"][5:]
            for k, gbs in e["gb_per_s"].items():
                ratio = e["bandwidth_ratio"].get(k)
                lines.append(
                    f"| {size} | {k} | {gbs:.2f} | "
                    + (
                        f"{ratio:.2f} | {_verdict(e['met'][k])} |"
                        if ratio is not None
                        else "1.00 | |"
                    )
                )


_OWN_TABLES = ("kernels_", "cold_compile_")  # metal rows that are not emulated/host ratios


def _cold_compile(rows: list[dict], lines: list[str]) -> None:
    for r in rows:
        if not r["case"].startswith("cold_compile_"):
            continue
        e = r["extra"]
        lines += [
            f"Cold compile of one `mps_emulated` partition ({e['description']}), median of "
            f"{r['samples']['cold']} sample(s):",
            "",
            "| caches | wall | CPU |",
            "|---|---|---|",
            *(f"| {k} | {e['wall_s'][k]:.1f} s | {e['cpu_s'][k]:.1f} s |" for k in e["wall_s"]),
            "",
        ]


def _metal(rows: list[dict], lines: list[str]) -> None:
    """Launch overhead, each model's Metal kernels, and the emulated/host table."""
    for r in rows:
        if r["case"] != "dispatch":
            continue
        e, us = r["extra"], r["median_us"]
        lines += [
            f"A trivial kernel ({e['threads']} threads, `out[i] = in[i] + 1`) launched "
            f"{e['launches_per_sample']} times per sample, median per launch:",
            "",
            "| launch path | us per launch |",
            "|---|---|",
            f"| through the shims from native code, as the Metal wrapper launches "
            f"({e['shim_calls_per_launch']} shim calls: command block, encoding, 2 tensors, "
            f"1 int, dispatch) | {us['shims']:.1f} |",
            f"| the same dispatch straight on the MSL executor's entry, from native code "
            f"| {us['executor']:.1f} |",
            *(
                [
                    f"| the same through the executor's Python API | {us['executor_from_python']:.1f} |"
                ]
                if "executor_from_python" in us
                else []
            ),
            f"| what the `aoti_torch_mps_*` layer adds | {e['shim_layer_us']:.1f} |",
            "",
        ]
    for r in rows:
        if not r["case"].startswith("kernels_"):
            continue
        e = r["extra"]
        lines += [
            f"{e['model']} lowered for `mps_emulated`, each Metal kernel timed per dispatch "
            f"while the model runs (shim argument check + executor), median of its dispatches:",
            "",
            "| kernel | grid | threadgroup | us per dispatch | dispatches per execute | does |",
            "|---|---|---|---|---|---|",
        ]
        for k in e["kernels"]:
            lines.append(
                f"| {k['kernel']} | {k['grid']} | {k['threadgroup']} | {k['median_us']:.1f} | "
                f"{k['dispatches_per_run']:g} | {k['does']} |"
            )
        lines += [
            "",
            f"Metal kernels: {_us(e['kernel_us_per_execute'])} of a "
            f"{_us(r['median_us']['execute'])} execute ({100 * e['kernel_share']:.0f}%); the "
            "rest is the fallbacks (matmul, convolution, attention over ATen), the wrapper and "
            "the runtime.",
            "",
        ]
    ratio_rows = [
        r for r in rows if r["case"] != "dispatch" and not r["case"].startswith(_OWN_TABLES)
    ]
    if ratio_rows:
        lines += [
            "Demo models (and a decode step of the two-method example LM) lowered for `host` and "
            "for `mps_emulated`, both `.pte` run by etmetal's runtime, interleaved with eager, "
            "outputs checked against eager first:",
            "",
        ]
        _ratio_table(ratio_rows, lines)
        best = ", ".join(f"{r['case']} {r['extra']['best_ratio']:.2f}" for r in ratio_rows)
        lines += ["", f"The same ratio from each arm's best sample instead of its median: {best}."]
        aims = [r for r in ratio_rows if "target_at_most" in r["extra"]]
        if aims:
            said = ", ".join(
                f"{r['case']} {'met' if r['extra']['target_met'] else 'missed'}" for r in aims
            )
            lines += [
                "",
                f"Issue 27's target, median mps_emulated/host at most "
                f"{aims[0]['extra']['target_at_most']}: {said}.",
            ]
        cpu = [r for r in ratio_rows if r["extra"].get("cpu_us")]
        if cpu:
            lines += [
                "",
                "CPU time per call (process user + system time over all of an arm's calls; "
                "wall above it is waiting for a core on this shared machine):",
                "",
                "| case | host CPU | mps_emulated CPU | mps_emulated/host CPU |",
                "|---|---|---|---|",
            ]
            for r in cpu:
                c = r["extra"]["cpu_us"]
                lines.append(
                    f"| {r['case']} | {_us(c['host'])} | {_us(c['mps_emulated'])} | "
                    f"{r['extra']['cpu_ratio']:.3f} |"
                )
    if any(r["case"].startswith("cold_compile_") for r in rows):
        lines.append("")
        _cold_compile(rows, lines)


def _imports(rows: list[dict], lines: list[str]) -> None:
    """Wall and CPU seconds per module, one fresh interpreter per sample."""
    by_case = {r["case"]: r for r in rows}
    wall, cpu = by_case["wall"], by_case["cpu"]
    limits = wall["extra"]["target_s_at_most"]
    lines += [
        '`python -c "import MODULE"` in a fresh interpreter, the modules in turns, median '
        f"of {max(wall['samples'].values())} runs each. CPU is user + system time of the "
        "child; wall above CPU is time spent waiting for a core on this shared machine.",
        "",
        "| module | wall | CPU | wall / torch | target | |",
        "|---|---|---|---|---|---|",
    ]
    for m, us in wall["median_us"].items():
        ratio = wall["ratios"].get(f"{m}/torch")
        limit = limits.get(m)
        verdict = ""
        if limit is not None:
            verdict = (
                f"wall {_verdict(wall['extra']['met_s'][m])}, "
                f"CPU {_verdict(cpu['extra']['met_s'][m])}"
            )
        lines.append(
            f"| {m} | {us / 1e6:.2f} s | {cpu['median_us'][m] / 1e6:.2f} s | "
            f"{'' if ratio is None else f'{ratio:.2f}'} | "
            f"{'' if limit is None else f'< {limit} s'} | {verdict} |"
        )


def targets(result: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(what, measured, target, met) for every target the suites measured."""
    out = []
    for name, doc in result["suites"].items():
        for r in doc["rows"]:
            e = r.get("extra", {})
            for k, lim in r["targets_at_most"].items():
                out.append(
                    (f"{name} {r['case']}: {k}", f"{r['ratios'][k]:.3g}", f"<= {lim}", r["met"][k])
                )
            if e.get("etmetal_error"):
                out.append(
                    (f"{name} {r['case']}: etmetal runs the .pte", "load failed", "runs", False)
                )
            if r["case"] == "loop_overhead":
                out.append(
                    (
                        "runtime loop overhead per instruction",
                        f"{e['etmetal_overhead_us_per_instruction']:.2f} us",
                        f"< {e['target_us_per_instruction']} us",
                        e["met_overhead"],
                    )
                )
            if r["case"] == "shim_calls":
                for k, ns in e["ns_per_call"].items():
                    out.append((f"shim call: {k}", f"{ns:.0f} ns", "< 2000 ns", e["met"][k]))
            if r["case"].startswith("copy_"):
                for k, ratio in e["bandwidth_ratio"].items():
                    out.append(
                        (
                            f"{r['case'][5:]} {k} / contiguous copy",
                            f"{ratio:.2f}",
                            ">= 0.5",
                            e["met"][k],
                        )
                    )
    return out


def render(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# etmetal benchmarks",
        "",
        "Generated by:",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"Run started {result['started_utc']}.",
        "",
        "## Method",
        "",
        _METHOD,
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu']}, nproc {m['nproc']} (shared with other jobs; load average at "
        f"the end {', '.join(f'{x:.1f}' for x in m['loadavg']) if m['loadavg'] else 'n/a'})",
        f"- {m['platform']}, Python {m['python']}",
        f"- torch {m['torch']}, executorch {m['executorch']}, "
        f"intra-op threads {m['torch_threads']}",
        "",
        "## Targets (issue 7)",
        "",
        "| measured | value | target | |",
        "|---|---|---|---|",
    ]
    lines += [f"| {w} | {v} | {t} | {_verdict(ok)} |" for w, v, t, ok in targets(result)]
    lines += [""]
    for name, doc in result["suites"].items():
        lines += _section(name, doc, result["commands"][name])
    return "\n".join(lines).rstrip() + "\n"


_TITLES = {
    "delegate": "Delegate latency: torch's AOTI runner vs etmetal (same generated kernels)",
    "runtime": "Runtime latency: one non-delegated .pte, stock executorch.runtime vs etmetal.runtime vs eager",
    "overhead": "Shim-call overhead and copy bandwidth",
    "lowering": "AOTI lowering time, cold vs cached",
    "metal": "Emulated Metal device (`mps_emulated`): launch overhead, kernels, emulated/host",
    "imports": "Import time in a fresh interpreter (issue 23)",
}


def _section(name: str, doc: dict[str, Any], command: str, when: str = "") -> list[str]:
    """One suite's section: its title, the command that made it, its tables."""
    lines = [f"## {_TITLES.get(name, name)}", "", f"`{command}` ({doc['wall_s']:.0f} s{when})", ""]
    rows = doc["rows"]
    if name == "overhead":
        _overhead(rows, lines)
    elif name == "metal":
        _metal(rows, lines)
    elif name == "imports":
        _imports(rows, lines)
    else:
        _ratio_table(rows, lines)
        if name == "runtime":
            _runtime_extra(rows, lines)
        if name == "delegate":
            for r in rows:
                e = r["extra"]
                lines.append("")
                overhead = e.get("method_overhead_us")
                lines.append(
                    f"{r['case']}: {e['shim_calls_per_run']} shim calls per run; "
                    f"etmetal path: {e['delegate_path']}"
                    + (
                        f"; the .pte path (edge lowering's graph, the Method's input "
                        f"checks and output handling) adds {overhead:.1f} us."
                        if overhead is not None
                        else "."
                    )
                )
    lines.append("")
    return lines


def update(markdown: str, result: dict[str, Any]) -> str:
    """``markdown`` (a BENCHMARKS.md) with the sections of the suites in ``result`` replaced
    (or appended), each saying when it ran and under what load; the other sections keep
    the numbers of their own run. Suites with targets are refused: the targets table at
    the top would keep the old values."""
    with_targets = sorted(
        {name for name, doc in result["suites"].items() if targets({"suites": {name: doc}})}
    )
    if with_targets:
        raise ValueError(
            f"suites {with_targets} report targets: regenerate the whole file (--write-md)"
        )
    load = result["machine"]["loadavg"]
    when = f"; `{result['command']}`, run {result['started_utc']}, load average at the end " + (
        ", ".join(f"{x:.1f}" for x in load) if load else "n/a"
    )
    out = markdown.rstrip() + "\n"
    for name, doc in result["suites"].items():
        text = "\n".join(_section(name, doc, result["commands"][name], when)).rstrip() + "\n"
        title = f"## {_TITLES.get(name, name)}\n"
        at = out.find(title)
        if at < 0:
            out += "\n" + text
            continue
        nxt = out.find("\n## ", at + len(title))
        out = out[:at] + text + ("" if nxt < 0 else out[nxt:])
    return out
