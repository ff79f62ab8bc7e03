"""Report plumbing of :mod:`etmetal.bench.llm`: the LLM section of BENCHMARKS.md."""

from __future__ import annotations


def test_bench_all_write_md_keeps_the_llm_section(tmp_path):
    # bench all rewrites the report without running bench llm: the section carries over
    from etmetal.bench.llm import _SECTION, carry_section

    section = f"{_SECTION[0]}\n## LLM\n\n| decode | 1 |\n{_SECTION[1]}"
    md = tmp_path / "BENCH.md"
    md.write_text(f"# old report\n\nold numbers\n\n{section}\n")
    new = carry_section(md, "# new report\n\nnew numbers\n")
    assert new == f"# new report\n\nnew numbers\n\n{section}\n"
    assert carry_section(tmp_path / "missing.md", "# new\n") == "# new\n"
    assert carry_section(md, f"# new\n\n{section}\n") == f"# new\n\n{section}\n"
