"""Shared model definitions used by tests, the CLI and benchmarks."""
