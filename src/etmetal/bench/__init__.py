"""Measuring code of `etmetal bench`: interleaved timing and the benchmark arms. The CLI only parses, calls and prints."""
