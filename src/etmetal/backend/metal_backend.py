"""``MetalBackend``: compile one delegated partition with AOTInductor for a Metal target.

``preprocess`` moves the partition to the target's device, rewrites what Inductor
cannot lower as is (dim-order ops, view copies), compiles it through the shared
content-addressed cache (weights outside the ``.so``, no libtorch), checks that the
``.so`` calls no fallback the target's runtime lacks, signs it on macOS if asked,
and stores ``.so`` and weights as named data: in upstream's layout (one weights blob)
for programs meant for ExecuTorch's runtime, one entry per constant for ``host``
programs meant for etmetal's (so methods holding the same weight share one entry;
compile spec ``share_weights``, see :mod:`.compile_specs`).

Backend lookup: exir finds a backend by *class name* among
``BackendDetails.__subclasses__()`` (first match in ``to_backend``, last match in the
multi-method path), so with ExecuTorch's own ``MetalBackend`` imported too, the name
``MetalBackend`` is ambiguous. etmetal's delegation specs therefore carry
:data:`BACKEND_ID`: text ``MetalBackend`` (what the ``.pte`` records, so runtimes find
the Metal delegate) that compares and hashes as :data:`LOOKUP_NAME`, the distinct
name of :class:`EtmetalMetalBackend`. Both lookups then resolve to etmetal,
whatever else is imported.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from etmetal.backend.passes.dim_order_to_aten_pass import DimOrderToAtenPass
from etmetal.backend.passes.inline_scalar_constants_pass import InlineScalarConstantsPass
from etmetal.backend.passes.replace_view_copy_with_view_pass import ReplaceViewCopyWithViewPass
from etmetal.common.fallback_table import PROXY_EXECUTOR_SHIM, runtime_shims

from .aoti_compile import AotiArtifact, compile_exported_program
from .codesign import codesign
from .compile_specs import parse_compile_specs, shares_weights
from .delegate_blobs import pack_delegate_blobs
from .mps_abi import MPS_RUNTIME_ABI
from .targets import (
    AUTO,
    MPS,
    TARGET_NAMES,
    MetalTarget,
    get_target,
    resolve_runtime,
    resolve_target,
)
from .weights_split import SplitWeights, split_weights

log = logging.getLogger(__name__)

DELEGATE_ID = "MetalBackend"
LOOKUP_NAME = "EtmetalMetalBackend"


class MetalBackendId(str):
    """A backend id that reads ``MetalBackend`` but resolves to :class:`EtmetalMetalBackend`.

    Equality and hash follow :data:`LOOKUP_NAME`, so exir's lookups by class name
    (``backend_id == cls.__name__`` and a dict keyed by class names) pick etmetal's
    backend; the string value, which the emitter writes into the program, stays
    ``MetalBackend``. Note ``BACKEND_ID == "MetalBackend"`` is therefore False: compare
    ``str(backend_id)`` when inspecting lowered modules in Python.
    """

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MetalBackendId):
            return True
        if isinstance(other, str):
            return str.__eq__(LOOKUP_NAME, other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(LOOKUP_NAME)

    def __reduce__(self) -> tuple[Any, ...]:
        return (MetalBackendId, (str.__str__(self),))

    def __str__(self) -> str:
        return str.__str__(self)


BACKEND_ID = MetalBackendId(DELEGATE_ID)

_EXTERN_SYMBOL = re.compile(rb"aoti_torch_(?:cpu|mps|cuda)_[A-Za-z0-9_]+")
_PROXY_EXECUTOR = PROXY_EXECUTOR_SHIM.encode()


def calls_proxy_executor(so_bytes: bytes) -> bool:
    return _PROXY_EXECUTOR in so_bytes


def unsupported_externs(
    so_bytes: bytes, target: MetalTarget | str, runtime: str | None = None
) -> list[str]:
    """Fallback shims the compiled ``.so`` imports that ``runtime`` (default: the target's
    own) lacks for ``target``."""
    allowed = runtime_shims(target, resolve_runtime(runtime, target))
    found = {m.decode() for m in _EXTERN_SYMBOL.findall(so_bytes)} - MPS_RUNTIME_ABI
    missing = sorted(found - allowed)
    if calls_proxy_executor(so_bytes) and PROXY_EXECUTOR_SHIM not in allowed:
        missing.append(
            f"{PROXY_EXECUTOR_SHIM} (operators without a C shim; only etmetal's runtime "
            "has a proxy executor: lower with runtime='etmetal' to keep them)"
        )
    return missing


def _mutated_inputs(ep: ExportedProgram) -> set[str]:
    sig = ep.graph_signature
    return set(sig.buffers_to_mutate.values()) | set(sig.user_inputs_to_mutate.values())


def prepare_for_aoti(ep: ExportedProgram, target: MetalTarget | str) -> ExportedProgram:
    """Device move and the graph rewrites Inductor needs; returns the program to compile.
    (``mps_emulated`` moves to its fake ``mps`` device inside the compile.)"""
    target = get_target(target)
    if target is MPS:
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, target.torch_device)
    gm = ep.graph_module
    # the passes rewrite ``gm`` in place (each returns it in its PassResult)
    InlineScalarConstantsPass(ep)(gm)
    DimOrderToAtenPass()(gm)
    rewrite = ReplaceViewCopyWithViewPass(_mutated_inputs(ep))
    rewrite(gm)
    log.debug("view rewrite: %d as views, %d as view+clone", rewrite.as_view, rewrite.as_copy)
    return ep


def _split(
    ep: ExportedProgram, artifact: AotiArtifact, weights: bytes, share_mutable: bool
) -> SplitWeights | None:
    """The partition's constants cut one by one (None: keep the one blob, see
    :mod:`.weights_split`)."""
    cpp = artifact.wrapper_cpp_path
    if not weights or cpp is None:
        return None
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    return split_weights(cpp.read_text(), weights, mutated, share_mutable)


def preprocess_for_metal(ep: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
    options = parse_compile_specs(compile_specs)
    # a partition lowered without the partitioner (to_backend("MetalBackend", ...)) picks
    # its target the way the partitioner's "auto" does
    target = resolve_target(options.target or AUTO)
    runtime = resolve_runtime(options.runtime, target)
    where = f"method {options.method_name!r}" if options.method_name else "partition"
    try:
        share = shares_weights(options, target, runtime)
    except ValueError as exc:
        raise ValueError(f"Metal {where}: {exc}") from None
    ep = prepare_for_aoti(ep, target)
    artifact = compile_exported_program(ep, target=target, link_libtorch=False)
    so_bytes = artifact.so_bytes()
    missing = unsupported_externs(so_bytes, target, runtime)
    if missing:
        raise RuntimeError(
            f"Metal {where}: the {target} .so calls fallback kernels the {runtime} runtime "
            f"does not provide for {target}: {', '.join(missing)}. The partitioner should have "
            "kept these operators out; please report the model. Workaround: rewrite the "
            "operator or lower it with another backend."
        )
    extern_nodes = None
    if calls_proxy_executor(so_bytes):
        extern_nodes = artifact.extern_nodes_bytes()
        if extern_nodes is None:
            raise RuntimeError(
                f"Metal {where}: the {target} .so calls the proxy executor but AOTInductor "
                f"wrote no extern-node table for it (cache entry {artifact.key[:12]})"
            )
    if options.codesign_identity:
        with tempfile.TemporaryDirectory(prefix="etmetal-sign-") as tmp:
            signed = Path(tmp) / "model.so"
            shutil.copy2(artifact.so_path, signed)  # never sign the shared cache entry
            if codesign(signed, options.codesign_identity):
                so_bytes = signed.read_bytes()
    weights = artifact.weights_bytes()
    split = None
    if share:
        split = _split(ep, artifact, weights, options.share_mutable_buffers)
    processed, named_data = pack_delegate_blobs(so_bytes, weights, extern_nodes, split)
    log.info(
        "Metal %s compiled for %s (%s): .so %d bytes, weights %d bytes (%s)",
        where,
        target,
        "cache hit" if artifact.from_cache else "compiled",
        len(so_bytes),
        len(weights),
        f"{len(split.entries)} shared constants" if split is not None else "one blob",
    )
    return PreprocessResult(
        processed_bytes=processed, debug_handle_map={}, data_store_output=named_data
    )


@final
class MetalBackend(BackendDetails):
    """Ahead-of-time side of the Metal delegate (backend id ``MetalBackend``)."""

    TARGETS = TARGET_NAMES

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram, compile_specs: list[CompileSpec]
    ) -> PreprocessResult:
        return preprocess_for_metal(edge_program, compile_specs)


@final
class EtmetalMetalBackend(BackendDetails):
    """The distinct class name etmetal's :data:`BACKEND_ID` resolves to (see module doc)."""

    @staticmethod
    def preprocess(
        edge_program: ExportedProgram, compile_specs: list[CompileSpec]
    ) -> PreprocessResult:
        return preprocess_for_metal(edge_program, compile_specs)
