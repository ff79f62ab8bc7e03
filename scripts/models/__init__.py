"""Model definitions shared by the tests, the CLI (demo, regress) and the benchmarks."""
