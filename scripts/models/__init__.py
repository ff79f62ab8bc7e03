"""Model definitions shared by the tests, the CLI and the benchmarks."""
