"""Compile the ``.so``'s own input checks in, instead of switching them on through the environment.

Inductor's AOT wrapper checks every input's dtype, sizes, strides and device (and the
sizes/strides its fallback kernels return) only when the process environment has
``AOTI_RUNTIME_CHECK_INPUTS`` set: the generated ``_check_aoti_runtime_check_inputs_env()``
calls libc ``getenv`` on the first run and keeps the answer. A runtime that wants the
checks would have to write the process environment around that first run, which races
with any other thread reading it and leaks into subprocesses started meanwhile.

etmetal wants the checks on every delegate (a mismatched input must be an error, not an
out-of-bounds read), so it decides at compile time: while :func:`inputs_always_checked`
is active, the switch Inductor emits reads a constant instead of the environment. The
generated code is otherwise unchanged. torch's own runner builds (``link_libtorch=True``,
used by the benchmarks as the stock reference) are left as Inductor makes them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

# the expression Inductor's switch evaluates, and what it becomes: a non-"0" value
ENV_SWITCH = 'getenv("AOTI_RUNTIME_CHECK_INPUTS")'
ALWAYS_ON = '"1" /* etmetal: input checks compiled in */'

# part of every cache key: bump when the rewrite above changes
RECIPE = "input checks compiled in, v1"

# one patch at a time: two compiles in threads must not stack or undo each other's
_LOCK = threading.RLock()


class InputChecksError(RuntimeError):
    """Inductor's wrapper no longer carries the switch this module rewrites."""


@contextlib.contextmanager
def inputs_always_checked() -> Iterator[None]:
    """Within this block, AOT wrappers Inductor generates check their inputs on every run.

    Fails the compile (``InputChecksError``) if a wrapper was generated without the
    expected switch: a newer torch changed it, and silently shipping a ``.so`` that reads
    the environment again is what this module exists to prevent.
    """
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    original = CppWrapperCpu.generate_input_output_runtime_checks

    def generate_checked(self: Any) -> None:
        prefix = self.prefix
        splice = prefix.splice_aot
        rewritten = []

        def splice_aot(code: Any, strip: bool = False) -> None:
            if isinstance(code, str) and ENV_SWITCH in code:
                code = code.replace(ENV_SWITCH, ALWAYS_ON)
                rewritten.append(True)
            splice(code, strip=strip)

        prefix.splice_aot = splice_aot  # only for this call: the switch is emitted here
        try:
            original(self)
        finally:
            del prefix.splice_aot
        if not rewritten:
            import torch

            raise InputChecksError(
                f"torch {torch.__version__}: Inductor's AOT wrapper no longer emits "
                f"{ENV_SWITCH}; etmetal cannot compile the input checks in (update "
                "etmetal.backend.input_checks)"
            )

    with _LOCK:
        CppWrapperCpu.generate_input_output_runtime_checks = generate_checked
        try:
            yield
        finally:
            CppWrapperCpu.generate_input_output_runtime_checks = original
