"""Report plumbing of the suites that write their own marked section of BENCHMARKS.md."""

from __future__ import annotations

from etmetal.bench.sections import carry_sections, marked, write_section


def test_bench_all_write_md_keeps_every_marked_section(tmp_path):
    # bench all rewrites the report without running bench llm or bench native: both carry over
    llm, native = marked("llm", "## LLM\n\n| decode | 1 |"), marked("native", "## Native\n\nx")
    md = tmp_path / "BENCH.md"
    md.write_text(f"# old report\n\nold numbers\n\n{llm}\n{native}")
    new = carry_sections(md, "# new report\n\nnew numbers\n")
    assert new == f"# new report\n\nnew numbers\n\n{llm}\n{native}"
    assert carry_sections(tmp_path / "missing.md", "# new\n") == "# new\n"
    # a section the new text has already is not carried twice
    assert carry_sections(md, f"# new\n\n{llm}") == f"# new\n\n{llm}\n{native}"


def test_write_section_replaces_only_its_own_section(tmp_path):
    md = tmp_path / "BENCH.md"
    md.write_text(f"# report\n\n{marked('llm', 'old llm')}\n{marked('native', 'old native')}")
    write_section(md, "llm", "new llm")
    text = md.read_text()
    assert "new llm" in text and "old llm" not in text and "old native" in text
    write_section(md, "imports", "new section")
    assert md.read_text().rstrip().endswith(marked("imports", "new section").rstrip())


def test_native_section_judges_each_target_on_cpu_time():
    from etmetal.bench.native_shims import render

    def row(cpu: float, counts=None) -> dict:
        return {"wall_us": cpu * 2, "cpu_us": cpu, "counts": counts}

    results = {
        "tiny": {
            "torch_aoti": row(1.0),
            "etmetal_shims": row(1.4, (16, 0)),
            "etmetal_pte": row(2.5, (16, 0)),
        },
        "lm_30m_decode": {"torch_aoti": row(100.0), "etmetal_native": row(104.0, (500, 0))},
    }
    lines = render(results, "etmetal bench native", "now").splitlines()
    by_arm = {tuple(c.strip() for c in ln.split("|")[1:3]): ln for ln in lines if "| " in ln}
    assert "<= 1.5: met" in by_arm[("tiny", "etmetal_shims")]
    assert "<= 2.0: **missed**" in by_arm[("tiny", "etmetal_pte")]
    assert "1.040" in by_arm[("lm_30m_decode", "etmetal_native")]
    assert "<= 1.05: met" in by_arm[("lm_30m_decode", "etmetal_native")]
    assert "500 / 0" in by_arm[("lm_30m_decode", "etmetal_native")]


def test_native_section_judges_the_transformer_and_shows_the_paired_ratio():
    from etmetal.bench.native_shims import render

    def row(cpu: float, paired: float | None = None) -> dict:
        return {"wall_us": cpu, "cpu_us": cpu, "paired": paired, "counts": (273, 0)}

    results = {
        "transformer": {
            "torch_aoti": row(100.0),
            "etmetal_shims": row(104.0, 1.031),
            "etmetal_pte": row(106.0, 1.049),
            "stock_runtime": row(110.0, 1.09),
        }
    }
    lines = render(results, "etmetal bench native", "now").splitlines()
    by_arm = {tuple(c.strip() for c in ln.split("|")[1:3]): ln for ln in lines if "| " in ln}
    shims = [c.strip() for c in by_arm[("transformer", "etmetal_shims")].split("|")]
    assert shims[5:7] == ["1.040", "1.031"]  # the ratio of medians, then the paired one
    assert "<= 1.05: met" in by_arm[("transformer", "etmetal_shims")]
    # judged on the ratio of medians (1.06), not the paired ratio (1.049)
    assert "<= 1.05: **missed**" in by_arm[("transformer", "etmetal_pte")]
    assert "<=" not in by_arm[("transformer", "stock_runtime")]
