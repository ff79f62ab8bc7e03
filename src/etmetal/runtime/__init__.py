"""etmetal's Python ExecuTorch runtime: load a ``.pte``, plan its memory, run its methods.

Mirrors ``executorch.runtime``::

    program = Runtime.get().load_program("model.pte")
    method = program.load_method("forward")
    outputs = method.execute([x])
"""

from .backend_interface import BackendExecutor, BackendInitContext
from .delegates import lookup_delegate, register_delegate
from .errors import (
    DelegateError,
    EtmetalRuntimeError,
    ExecutionError,
    InputError,
    IntegrityError,
    InvalidProgramError,
    MissingDelegateError,
    MissingKernelError,
    ResourceLimitError,
    UntrustedNativeCodeError,
)
from .method import Method, MethodMeta, TensorSpec, ValueSpec
from .program import Program, Runtime

__all__ = [
    "BackendExecutor",
    "BackendInitContext",
    "DelegateError",
    "EtmetalRuntimeError",
    "ExecutionError",
    "InputError",
    "IntegrityError",
    "InvalidProgramError",
    "Method",
    "MethodMeta",
    "MissingDelegateError",
    "MissingKernelError",
    "Program",
    "ResourceLimitError",
    "Runtime",
    "TensorSpec",
    "UntrustedNativeCodeError",
    "ValueSpec",
    "lookup_delegate",
    "register_delegate",
]
