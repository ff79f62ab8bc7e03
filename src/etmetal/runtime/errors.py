"""The runtime's error classes. Every failure the runtime reports is one of these.

Messages name what was wrong: the method, the value index, the instruction index,
the operator or the file, so a bad program can be diagnosed from the message alone.
"""

from __future__ import annotations


class EtmetalRuntimeError(RuntimeError):
    """Base class of every error raised by ``etmetal.runtime``."""


class InvalidProgramError(EtmetalRuntimeError):
    """The ``.pte`` (or a ``.ptd``) is malformed or inconsistent."""


class MissingKernelError(InvalidProgramError):
    """The program uses operators that are not in the runtime's kernel table."""

    def __init__(self, method: str, operators: list[str]):
        self.method = method
        self.operators = list(operators)
        example = operators[0] if operators else "ns::op.overload"
        super().__init__(
            f"method {method!r}: no kernel for {len(operators)} operator(s): "
            + ", ".join(operators)
            + ". etmetal's runtime runs only the operators of its kernel table (ExecuTorch's "
            "kernel libraries, etmetal's own kernels and kernels registered explicitly); to "
            "run this program, register a kernel for each: "
            f"@etmetal.runtime.kernels.register_kernel({example!r}) on a function, an "
            "'executorch.runtime.kernels' entry point, or, if you trust torch's own "
            f"implementation with your process, etmetal.runtime.kernels.allow_torch_operator({example!r})"
        )


class MissingDelegateError(InvalidProgramError):
    """The program calls a delegate whose backend id is not registered."""


class DelegateError(EtmetalRuntimeError):
    """A delegate failed to initialize or execute."""


class ResourceLimitError(InvalidProgramError):
    """The program asks for more memory than the runtime's configured cap."""


class InputError(EtmetalRuntimeError):
    """``Method.execute`` was given inputs that do not match the method's specs."""


class ExecutionError(EtmetalRuntimeError):
    """An instruction failed while the method ran."""

    def __init__(self, message: str, *, method: str = "", instruction: int = -1):
        self.method = method
        self.instruction = instruction
        super().__init__(message)


def instruction_failed(
    method: str, label: str, instruction: int, exc: BaseException
) -> ExecutionError:
    """The error for instruction ``label`` of ``method`` raising ``exc`` (chain it ``from exc``)."""
    message = str(exc) if isinstance(exc, EtmetalRuntimeError) else f"{type(exc).__name__}: {exc}"
    return ExecutionError(
        f"method {method!r}: {label} failed: {message}", method=method, instruction=instruction
    )


class IntegrityError(InvalidProgramError):
    """A blob in the program does not match the hash it is stored under (altered bytes)."""


class UntrustedNativeCodeError(DelegateError):
    """The program carries native code the caller did not opt in to running."""
