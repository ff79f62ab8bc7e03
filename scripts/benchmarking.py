"""Moved to :mod:`etmetal.testing.benchmarking` (the timing every benchmark driver shares);
this name stays for drivers that still import it from here."""

from etmetal.testing.benchmarking import (  # noqa: F401 - re-exported
    Arm,
    Comparison,
    Timing,
    add_common_arguments,
    calibrate_inner,
    cpu_model,
    emit,
    interleaved,
    machine,
    paired_median_difference,
    print_comparison,
)
