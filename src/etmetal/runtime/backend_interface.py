"""The contract between the runtime and a delegate (``BackendExecutor``).

Mirrors ExecuTorch's C++ ``BackendInterface`` (init / execute / destroy). A delegate
is found by its backend id (``MetalBackend``) in the runtime's delegate registry,
which also reads the ``executorch.runtime.delegates`` entry-point group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BackendInitContext:
    """What a delegate may see while it initializes."""

    method_name: str
    # named data of the program and its external .ptd files: key -> bytes-like
    get_named_data: Callable[[str], memoryview]
    # native code (a .so inside the program) runs only when the caller trusted it
    trust_native_code: bool = False
    trusted_blob_hashes: frozenset[str] = field(default_factory=frozenset)
    # scratch space for runtime-wide settings a backend may read (e.g. isolate)
    options: dict[str, Any] = field(default_factory=dict)
    # one dict per loaded program, the same for every method's delegates: what a backend
    # loads once and lends to all of them (the Metal delegate's shared constants)
    program_cache: dict[str, Any] = field(default_factory=dict)


class BackendExecutor(ABC):
    """One initialized delegate blob. ``init`` runs once at method load."""

    # True when ``execute_fresh`` returns new output tensors (see ``direct_delegate``)
    supports_fresh_outputs: bool = False

    @classmethod
    @abstractmethod
    def init(
        cls,
        context: BackendInitContext,
        processed: bytes,
        compile_specs: Sequence[tuple[str, bytes]],
    ) -> BackendExecutor:
        """Build the executor from the delegate's processed bytes and compile specs."""

    @abstractmethod
    def execute(self, args: list[Any]) -> None:
        """Run once. ``args`` are the delegate call's values in order: inputs, then outputs.

        Tensors are ``torch.Tensor`` objects over the runtime's planned memory; the
        delegate reads inputs and writes outputs in place (resizing an output within
        its planned capacity is allowed for dynamic shapes, via ``Tensor.resize_``).
        Non-tensor values are Python ints/floats/bools.
        """

    def execute_fresh(self, inputs: list[Any], planned_outputs: list[Any]) -> list[Any]:
        """Run once and return the outputs as tensors the caller may keep.

        Only called when ``supports_fresh_outputs``, for a method that is this one call:
        ``inputs`` may be the caller's own tensors (with the planned layout); an output
        may be written into ``planned_outputs[i]`` and a copy of it returned instead.
        """
        self.execute([*inputs, *planned_outputs])
        return [t.clone() if hasattr(t, "clone") else t for t in planned_outputs]

    def prepare_fresh(
        self, planned_inputs: list[Any], planned_outputs: list[Any], **how: Any
    ) -> Callable[[Sequence[Any]], list[Any]] | None:
        """Optional, for a method that is this one call (``direct_delegate``): a callable
        that runs ``execute``-with-inputs and returns what ``execute_fresh`` would, with
        the method's own checks and locking done inside (``how``: ``fallback``, the
        method's own path, for every call it does not serve; ``wrap``, the error an
        exception becomes; ``guard``/``guard_owner``, the method's lock and owner record).
        None (the default): the method runs ``execute_fresh`` through Python."""
        return None

    def check_call(self, args: list[Any]) -> None:  # noqa: B027 - optional hook
        """At load, once per delegate call: the values the call will pass, in order
        (``None`` where a value is only known at run time). Raise to refuse the program."""

    def destroy(self) -> None:  # noqa: B027 - optional hook
        """Release everything ``init`` acquired."""
