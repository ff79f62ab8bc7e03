"""What tests, benchmarks and users' own test suites plug in to check etmetal against an
independent reference: ExecuTorch backend-suite flows (a pytest plugin), the ``view_copy``
layout matrix on the stock runtime, the Cortex-M case check, the seeded fuzz campaign and
its worker, the benchmarks' interleaved timing (``benchmarking``) and the emulated Metal
device's measurements (``metal_bench``). Test-only helpers go here, not in ``scripts/``
and not in the library packages; the CLI's ``regress`` and ``bench`` drivers call them."""
