"""How large a launch the emulated Metal device accepts.

Metal's thread positions are ``uint32`` per dimension, and the CPU executor runs threads one
after another: a grid past :data:`DEFAULT_LAUNCH_LIMIT` threads would run for minutes, so
it is refused unless ``ETMETAL_MPS_MAX_THREADS`` allows it. Totals are Python integers: a
product such as 2^32 x 2^32 cannot wrap around to an empty grid.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

MAX_GRID_DIM = (1 << 32) - 1
LAUNCH_LIMIT_ENV = "ETMETAL_MPS_MAX_THREADS"
DEFAULT_LAUNCH_LIMIT = 1 << 28  # seconds of the CPU executor, not minutes


def _from_env() -> int:
    raw = os.environ.get(LAUNCH_LIMIT_ENV, "")
    try:
        value = int(raw, 0) if raw else DEFAULT_LAUNCH_LIMIT
    except ValueError:
        value = DEFAULT_LAUNCH_LIMIT
    return value if value > 0 else DEFAULT_LAUNCH_LIMIT


# read once: a launch pays no environment lookup (tests may assign it)
launch_limit = _from_env()


def check_grid(threads: Sequence[int], error: Callable[[str], Exception]) -> int:
    """The grid's thread count; ``error(message)`` is raised for a dimension past 2^32-1 or
    a total past :data:`launch_limit`."""
    total = 1
    for d, n in enumerate(threads):
        if n > MAX_GRID_DIM:
            raise error(f"grid size {n} in dimension {d} exceeds 2^32-1")
        total *= n
    if total > launch_limit:
        raise error(
            f"a grid of {tuple(threads)} is {total} threads, more than the launch limit of "
            f"{launch_limit} (set {LAUNCH_LIMIT_ENV} to raise it)"
        )
    return total
