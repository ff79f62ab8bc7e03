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
