"""``Runtime`` and ``Program``: the entry points, mirroring ``executorch.runtime``."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from .backend_interface import BackendInitContext
from .errors import EtmetalRuntimeError, InvalidProgramError
from .instructions import prepare_method
from .loader import PathOrBytes, ProgramData, load_program_data
from .method import Method, MethodMeta
from .values import build_values, describe_values


class Program:
    """A loaded ``.pte``: its methods can be loaded (and each executed) independently."""

    def __init__(
        self,
        data: ProgramData,
        *,
        trust_native_code: bool = False,
        trusted_blob_hashes: Iterable[str] = (),
        memory_cap: int | None = None,
        options: dict[str, Any] | None = None,
        isolate: bool = False,
    ):
        self._data = data
        self._isolate = isolate
        self._plans = {plan.name: plan for plan in data.program.execution_plan}
        self._trust = trust_native_code
        self._trusted = frozenset(trusted_blob_hashes)
        self._memory_cap = memory_cap
        self._options = dict(options or {})
        self._meta: dict[str, MethodMeta] = {}
        # what delegates of different methods share (BackendInitContext.program_cache)
        self._program_cache: dict[str, Any] = {}

    @property
    def method_names(self) -> set[str]:
        return set(self._plans)

    @property
    def source(self) -> str:
        return self._data.source

    def _plan(self, name: str):
        plan = self._plans.get(name)
        if plan is None:
            raise EtmetalRuntimeError(
                f"{self._data.source}: no method {name!r}; methods: {sorted(self._plans)}"
            )
        return plan

    def _named_data(self, key: str) -> memoryview:
        blob = self._data.named_data.get(key)
        if blob is None:
            raise KeyError(f"named data {key!r} is in neither the program nor its data files")
        return memoryview(blob)

    def _context(self, method_name: str, host=None) -> BackendInitContext:
        options = dict(self._options)
        if host is not None:
            options["isolation_host"] = host
        return BackendInitContext(
            method_name=method_name,
            get_named_data=self._named_data,
            trust_native_code=self._trust,
            trusted_blob_hashes=self._trusted,
            options=options,
            program_cache=self._program_cache,
        )

    def load_method(self, name: str) -> Method:
        plan = self._plan(name)
        host = None
        if self._isolate and plan.delegates:
            from .isolation import IsolationHost

            host = IsolationHost(name, self._data.named_data)
        try:
            table = build_values(
                plan, self._data, self._memory_cap, host.allocate if host is not None else None
            )
            prepared = prepare_method(
                plan, table, self._data.program, lambda n: self._context(n, host)
            )
        except BaseException as exc:
            if host is not None:
                host.close()
            if isinstance(exc, EtmetalRuntimeError) or not isinstance(
                exc, (Exception, RecursionError)
            ):
                raise
            # validation above is meant to catch everything; this is the backstop
            raise InvalidProgramError(
                f"{self._data.source}: method {name!r} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        method = Method(plan, table, prepared, isolation=host)
        self._meta.setdefault(name, method.metadata)
        return method

    def metadata(self, name: str) -> MethodMeta:
        """The method's metadata, read from the program without loading the method."""
        if name not in self._meta:
            plan = self._plan(name)
            try:
                table = describe_values(plan, self._data, list(plan.inputs) + list(plan.outputs))
            except EtmetalRuntimeError:
                raise
            except Exception as exc:
                raise InvalidProgramError(
                    f"{self._data.source}: method {name!r}: bad metadata: {type(exc).__name__}: {exc}"
                ) from exc
            self._meta[name] = MethodMeta(plan, table)
        return self._meta[name]


class Runtime:
    """Process-wide entry point: ``Runtime.get().load_program(...)``."""

    _instance: Runtime | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> Runtime:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def load_program(
        self,
        data: PathOrBytes,
        *,
        data_files: Iterable[PathOrBytes] | PathOrBytes | None = None,
        trust_native_code: bool = False,
        trusted_blob_hashes: Iterable[str] = (),
        memory_cap: int | None = None,
        options: dict[str, Any] | None = None,
        isolate: bool = False,
    ) -> Program:
        """Load a ``.pte`` (path or bytes) and optional external ``.ptd`` data files.

        ``trust_native_code`` opts in to delegates that run native code from the program;
        ``memory_cap`` bounds the bytes each method may plan (default: half of RAM);
        ``isolate`` runs each method's delegates in a worker process over shared memory,
        so a delegate that crashes raises ``DelegateError`` instead of ending this process
        (see ``etmetal.runtime.isolation``).
        """
        if data_files is None:
            files = []
        elif isinstance(data_files, (str, bytes, bytearray, memoryview)) or hasattr(
            data_files, "__fspath__"
        ):
            files = [data_files]
        else:
            files = list(data_files)
        try:
            loaded = load_program_data(data, files)
        except EtmetalRuntimeError:
            raise
        except (Exception, RecursionError) as exc:
            raise InvalidProgramError(f"cannot load program: {type(exc).__name__}: {exc}") from exc
        return Program(
            loaded,
            trust_native_code=trust_native_code,
            trusted_blob_hashes=trusted_blob_hashes,
            memory_cap=memory_cap,
            options=options,
            isolate=isolate,
        )
