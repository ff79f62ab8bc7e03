"""The ``MetalBackend`` delegate at run time: an AOTI ``.so`` executed through etmetal's shims.

A Metal delegate's processed bytes name its named-data entries (the program or an
external ``.ptd`` holds the bytes; format: :mod:`etmetal.common.delegate_blobs`): the
``.so``, its constants (upstream's one ``<sha256>_weights_blob``, or a
``<sha256>_weights_index`` naming one entry per constant) and, when the ``.so`` runs
operators without a C shim through etmetal's proxy executor, its extern-node table.
``init`` checks each entry against the hash in its key, refuses native code the caller
did not trust, writes the ``.so`` into a private directory, loads it through the shim
bridge and creates the model container with its constants borrowed from the weights
blob, or lent the program's one copy of each constant (:mod:`.shared_weights`), so
every method reads the same weights. ``execute`` lends the runtime's planned input
memory to the ``.so`` (no copy) and copies the results into the planned outputs.

A delegate compiled for ``mps_emulated`` (compile spec ``target``) is Inductor's real
Metal program with its wrapper built for this CPU: its container is created for device
``mps``, it loads its constants into an ``aoti_torch_mps_malloc`` buffer
(``aoti_torch_mps_memcpy`` from the weights blob), the runtime's inputs are lent to it
as ``mps`` tensors over the same memory, and its kernels run on etmetal's emulated
Metal device (``etmetal.shims.emulated_mps``).

Trust: a ``.so`` is native code with the caller's privileges, so it runs only when
one of these holds:

- ``load_program(..., trust_native_code=True)`` or ``$ETMETAL_TRUST_NATIVE_CODE=1``;
- the delegate's digest is in ``load_program(..., trusted_blob_hashes=[...])`` or in
  ``$ETMETAL_TRUSTED_BLOBS`` (comma-separated hex digests). The delegate digest
  (:func:`etmetal.common.delegate_blobs.delegate_digest`, printed when a delegate is
  refused) covers every byte that steers the native code: the processed bytes, which
  name the ``.so``, the weights and the extern-node table by their sha256 (each checked
  here before the trust decision), and the compile specs (the target decides the device
  the container runs on);
- the ``.so``'s own sha256 (with or without the ``_so_blob`` suffix) is in the same
  list, *and* the delegate has no extern-node table and runs on the host. This is the
  one case where the ``.so`` digest alone pins the behaviour: the weights (one blob or
  an index of per-constant entries) are checked against the ``.so``'s own constant table
  (size, and dtype for lent constants) before any is read, so other weights change the
  numbers the code computes on, never which code runs or what it reads beyond them.
  An extern-node table names the operators the ``.so`` makes etmetal call, and the
  target selects another device for the same code; both steer native execution, so a
  ``.so`` digest never vouches for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from etmetal.common import delegate_blobs as blob_format
from etmetal.common.delegate_blobs import key_digest
from etmetal.common.targets import (
    CPU_DEVICE,
    HOST,
    MPS_EMULATED,
    RUNNABLE_TARGETS,
    SHARE_MUTABLE_BUFFERS_KEY,
    TARGET_SPEC_KEY,
    TARGETS,
    MetalTarget,
)

from .backend_interface import BackendExecutor, BackendInitContext
from .delegates import register_delegate
from .errors import (
    DelegateError,
    ExecutionError,
    IntegrityError,
    InvalidProgramError,
    UntrustedNativeCodeError,
)
from .layout import resize_in_dim_order
from .shared_weights import load_constants, read_index
from .tempfiles import private_dir, track, write_private_file
from .tempfiles import remove as remove_private_dir

BACKEND_ID = "MetalBackend"
TRUST_ENV = "ETMETAL_TRUST_NATIVE_CODE"
TRUSTED_BLOBS_ENV = "ETMETAL_TRUSTED_BLOBS"
# the targets this runtime can execute, with the device the .so's container is created
# for (an mps .so needs Metal; an mps_emulated one runs on the emulated device)
TARGET_DEVICES = {t.name: t.container_device for t in RUNNABLE_TARGETS}
_TMP_PREFIX = "etmetal-delegate-"  # tempfiles.private_dir("delegate") names: prefix + pid


def parse_keys(processed: bytes, where: str) -> blob_format.DelegateKeys:
    """The named-data keys a Metal delegate's processed bytes name."""
    try:
        return blob_format.parse_keys(processed)
    except ValueError as exc:
        raise InvalidProgramError(f"{where}: {exc}") from None


def _target(compile_specs: Sequence[tuple[str, bytes]], where: str) -> MetalTarget:
    """The delegate's target record (no ``target`` key: ``host``, as lowered without the
    partitioner); a DelegateError when this runtime cannot run it."""
    name = None
    for key, value in compile_specs:
        if key == TARGET_SPEC_KEY:
            name = bytes(value).decode("utf-8", errors="replace")
    record = HOST if name is None else TARGETS.get(name)
    if record is None or not record.etmetal_runs:
        runnable = ", ".join(t.name for t in RUNNABLE_TARGETS)
        raise DelegateError(
            f"{where}: compiled for target {name!r}; etmetal's runtime runs "
            f"{runnable} code only (run {name!r} programs with "
            f"ExecuTorch's Metal runtime on macOS, or export with target={HOST.name!r} or "
            f"{MPS_EMULATED.name!r})"
        )
    return record


def trusted_hashes_from_env() -> frozenset[str]:
    raw = os.environ.get(TRUSTED_BLOBS_ENV, "")
    return frozenset(
        key_digest(h.strip().lower()) or h.strip().lower() for h in raw.split(",") if h
    )


def is_trusted(context: BackendInitContext, digest: str, so_digest: str | None = None) -> bool:
    """True when the caller trusts this delegate: all native code, the delegate digest, or
    (``so_digest``, passed only where a bare ``.so`` digest is enough) the ``.so``'s."""
    if context.trust_native_code:
        return True
    allowed = {key_digest(h.lower()) or h.lower() for h in context.trusted_blob_hashes}
    allowed |= trusted_hashes_from_env()
    if digest in allowed or (so_digest is not None and so_digest in allowed):
        return True
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


def _named_blob(context: BackendInitContext, key: str, where: str) -> memoryview:
    try:
        blob = context.get_named_data(key)
    except KeyError:
        raise InvalidProgramError(
            f"{where}: named data {key!r} is in neither the program nor its data files; if the "
            "program was exported with external data, pass its .ptd to "
            "load_program(..., data_files=[...])"
        ) from None
    view = memoryview(blob)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _check_integrity(blob: memoryview, key: str, what: str, where: str) -> None:
    actual = hashlib.sha256(blob).hexdigest()
    if actual != key_digest(key):
        raise IntegrityError(
            f"{where}: the {what} blob does not match its key: sha256 {actual}, key {key!r} "
            f"({len(blob)} bytes); the program was altered or corrupted after export"
        )


def write_private_so(so: memoryview) -> tuple[Path, Path]:
    """Write the ``.so`` into a fresh private directory (mode 0700, named by this pid so a
    later process can sweep it if this one is killed); returns (dir, file)."""
    directory = private_dir("delegate")
    try:
        # O_EXCL | O_NOFOLLOW: never write through a planted file or symlink
        return directory, write_private_file(directory, "delegate.so", so)
    except BaseException:
        remove_private_dir(directory)
        raise


@register_delegate(BACKEND_ID)
class MetalDelegate(BackendExecutor):
    """One Metal (AOTI) delegate blob, loaded and ready to execute."""

    supports_fresh_outputs = True

    def __init__(self, model, directory: Path, where: str, weights: memoryview) -> None:
        self._model = model
        self._dir = directory
        self._where = where
        self._weights = weights  # constants borrow these bytes until destroy
        self._constants = model.constants  # shared constants lent to the .so, idem
        self.num_inputs: int = model.num_inputs
        self.num_outputs: int = model.num_outputs
        self.so_digest = ""
        self.digest = ""  # the delegate digest the trust decision was made over
        self._out_capacity: list[int | None] | None = None  # set by check_call

    @classmethod
    def init(
        cls,
        context: BackendInitContext,
        processed: bytes,
        compile_specs: Sequence[tuple[str, bytes]],
    ) -> MetalDelegate:
        where = f"method {context.method_name!r}: {BACKEND_ID} delegate"
        target = _target(compile_specs, where)
        if target.container_device != CPU_DEVICE and any(
            k == SHARE_MUTABLE_BUFFERS_KEY and bytes(v) == b"1" for k, v in compile_specs
        ):
            raise DelegateError(
                f"{where}: a {target.name!r} delegate lowered with share_mutable_buffers: "
                "this runtime keeps an emulated-Metal container's buffers per method; run "
                "the program in the stock runtime with etmetal.stock_runtime.register(), "
                "which shares them, or lower without the compile spec"
            )
        keys = parse_keys(processed, where)
        so = _named_blob(context, keys.so, where)
        weights = _named_blob(context, keys.weights, where)
        _check_integrity(so, keys.so, ".so", where)
        _check_integrity(weights, keys.weights, "weights", where)
        extern_nodes = None
        if keys.extern_nodes is not None:  # operators the .so runs through the proxy executor
            extern_nodes = _named_blob(context, keys.extern_nodes, where)
            _check_integrity(extern_nodes, keys.extern_nodes, "extern-node table", where)
        constants = None
        if keys.shared_weights:  # one named-data entry per constant, lent in place
            if target.container_device != CPU_DEVICE:
                raise InvalidProgramError(
                    f"{where}: a {target.name!r} delegate names a weights index; the shared-weights "
                    "layout is written for host delegates only (their constants live in host "
                    "memory)"
                )
            entries = read_index(weights, where)
            constants = load_constants(
                entries, lambda k: _named_blob(context, k, where), context.program_cache, where
            )
            weights = memoryview(b"")
        so_key = keys.so
        so_digest = key_digest(so_key)
        digest = blob_format.delegate_digest(processed, list(compile_specs))
        # a bare .so digest vouches only for a delegate nothing else steers (module doc)
        so_alone = keys.extern_nodes is None and target.container_device == CPU_DEVICE
        if not is_trusted(context, digest, so_digest if so_alone else None):
            raise UntrustedNativeCodeError(
                f"{where}: the program contains native code (an AOTI .so, sha256 {so_digest}) "
                "and running it gives the file your process's privileges. Load it only if you "
                "trust where it came from, by one of: load_program(..., trust_native_code=True); "
                f"load_program(..., trusted_blob_hashes=['{digest}']) (this delegate's digest: "
                "the .so, its weights, extern-node table and compile specs together); "
                f"{TRUSTED_BLOBS_ENV}={digest}; {TRUST_ENV}=1; "
                f"or `etmetal run --trust-native-code` / `--trust-hash {digest}`"
                + (
                    ""
                    if so_alone
                    else "; the .so's own sha256 is not enough for this delegate: its "
                    "extern-node table or target steers what the .so runs"
                )
            )
        from etmetal.shims import AotiModel  # the bridge is built on first use

        directory, so_path = write_private_so(so)
        try:
            model = AotiModel(
                so_path,
                weights if len(weights) else None,
                device=target.container_device,
                extern_nodes=None if extern_nodes is None else bytes(extern_nodes),
                constants=constants,
            )
        except BaseException as exc:
            remove_private_dir(directory)
            if isinstance(exc, Exception):
                raise DelegateError(f"{where}: loading the .so failed: {exc}") from exc
            raise
        self = cls(model, directory, where, weights)
        self._cleanup = track(self, directory)  # also on collection and at exit
        self.so_digest = so_digest
        self.digest = digest
        return self

    def check_call(self, args: list) -> None:
        """At load: the delegate call passes as many inputs and outputs as the ``.so`` takes."""
        expected = self.num_inputs + self.num_outputs
        if len(args) != expected:
            raise InvalidProgramError(
                f"{self._where}: the delegate call passes {len(args)} values, the .so takes "
                f"{self.num_inputs} inputs and {self.num_outputs} outputs"
            )
        for i, value in enumerate(args):
            if value is not None and not isinstance(value, torch.Tensor):
                kind = "input" if i < self.num_inputs else "output"
                raise InvalidProgramError(
                    f"{self._where}: call value {i} ({kind}) is a {type(value).__name__}; "
                    "the .so takes tensors only"
                )
        # at load, planned tensors have their upper-bound sizes: what an output may grow to
        self._out_capacity = [
            t.numel() if isinstance(t, torch.Tensor) else None for t in args[self.num_inputs :]
        ]

    def execute(self, args: list) -> None:
        n_in = self.num_inputs
        if len(args) != n_in + self.num_outputs:
            raise DelegateError(
                f"{self._where}: called with {len(args)} values, expected "
                f"{n_in} inputs + {self.num_outputs} outputs"
            )
        model = self._model
        if model is None:
            raise DelegateError(f"{self._where}: executed after destroy")
        # outputs that come back as planned are written into the planned tensors directly
        results = model.run_into(args[:n_in], args[n_in:])
        for i, (dst, src) in enumerate(zip(args[n_in:], results)):
            if src is not None:
                self._place(i, dst, src)

    def execute_fresh(self, inputs: list, planned_outputs: list) -> list[torch.Tensor]:
        model = self._model
        if model is None:
            raise DelegateError(f"{self._where}: executed after destroy")
        return self._fresh(model.run(inputs), planned_outputs)  # new tensors to keep

    def prepare_fresh(
        self,
        planned_inputs: list,
        planned_outputs: list,
        *,
        fallback,
        wrap,
        guard=None,
        guard_owner=None,
    ):
        """The model's one-call run (``shims/fast_run.py``) for a direct call: it serves
        inputs of the planned layouts whose outputs come back as planned, and hands every
        other call to ``fallback``; a run it started that came back unusual is finished
        as ``execute_fresh`` finishes it, errors passed through ``wrap``."""
        model = self._model
        if model is None:
            return None

        def finish(inputs: list, rc: int, results: list) -> list:
            try:
                return self._fresh(model.finish_fast(inputs, rc, results), planned_outputs)
            except ExecutionError:
                raise
            except (Exception, RecursionError) as exc:
                raise wrap(exc) from exc

        return model.fast_run(
            fallback=fallback,
            finish=finish,
            expect_in=planned_inputs,
            expect_out=planned_outputs,
            guard=guard,
            guard_owner=guard_owner,
        )

    def _fresh(self, results: list, planned_outputs: list) -> list[torch.Tensor]:
        """``results`` in the planned layouts (copied through the plan where they differ)."""
        for i, (dst, src) in enumerate(zip(planned_outputs, results)):
            if src.dtype != dst.dtype or src.shape != dst.shape or src.stride() != dst.stride():
                self._place(i, dst, src)  # the planned layout, as the general path returns
                results[i] = dst.clone()
        return results

    def _place(self, i: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy output ``i`` into its planned tensor, resizing within the planned capacity."""
        if dst.dtype != src.dtype:
            raise DelegateError(
                f"{self._where}: output {i} is {src.dtype}, the program planned {dst.dtype}"
            )
        if dst.shape != src.shape:  # dynamic shapes: stay within the planned memory
            capacity = self._out_capacity[i] if self._out_capacity else None
            if capacity is None:
                storage = dst.untyped_storage().nbytes() // dst.element_size()
                capacity = storage - dst.storage_offset()
            resize_in_dim_order(dst, src.shape, capacity)
        dst.copy_(src)

    def destroy(self) -> None:
        model, self._model = self._model, None
        try:
            if model is not None:
                # container and constants freed; the .so stays mapped: AOTI's .so has
                # STB_GNU_UNIQUE symbols, which make glibc's dlclose a no-op
                model.close()
        finally:
            self._weights = None
            self._constants = None
            if self._dir is not None:
                remove_private_dir(self._dir)
                self._dir = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self.destroy()
