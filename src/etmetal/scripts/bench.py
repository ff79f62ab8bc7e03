"""``etmetal bench SUITE``: benchmarks side by side with the stock tools."""

from etmetal.scripts.suites import make_command

SUITES = {
    "shims": ("etmetal.scripts.bench_shims", "ns per shim call and strided-gather bandwidth"),
    "runtime": ("etmetal.scripts.bench_runtime", "runtime latency vs executorch.runtime and eager"),
    "delegate": ("etmetal.scripts.bench_delegate", "delegate latency vs torch's AOTI runner"),
    "lowering": ("etmetal.scripts.bench_lowering", "AOTI lowering time, cold vs cached"),
    "overhead": (
        "etmetal.scripts.bench_overhead",
        "ns per shim call; view_copy and gather bandwidth vs a contiguous copy",
    ),
    "metal": (
        "etmetal.scripts.bench_metal",
        "emulated Metal: kernel launch overhead, per-kernel times, emulated/host ratio",
    ),
    "llm": (
        "etmetal.scripts.bench_llm",
        "a ~30M two-method decoder LM: latency vs eager and torch's AOTI runner; "
        ".pte size and peak RSS with and without weight sharing",
    ),
    "all": (
        "etmetal.scripts.bench_all",
        "every suite, each in its own process; writes BENCHMARKS.md",
    ),
    "imports": (
        "etmetal.scripts.bench_imports",
        "import time of etmetal.runtime (and torch, etmetal.shims, executorch.runtime) "
        "in fresh interpreters, wall and CPU",
    ),
    "native": (
        "etmetal.scripts.bench_native",
        "native shims vs Python shims vs torch's AOTI runner: shim calls per run reaching "
        "Python, tiny model and LM decode/prefill latency (CPU and wall)",
    ),
    "isolation": (
        "etmetal.scripts.bench_isolation",
        "execute latency with isolate=True vs in-process",
    ),
    "fuzz": (
        "etmetal.scripts.bench_fuzz",
        "seeded fuzz campaign over delegated programs (--cases N)",
    ),
}

add_arguments, run = make_command(SUITES)
