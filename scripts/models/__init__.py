"""Model definitions shared by tests, the CLI and benchmarks."""
