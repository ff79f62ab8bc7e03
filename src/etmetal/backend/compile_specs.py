"""The compile specs a Metal delegate carries, checked once where they enter.

``CompileSpec(key, value: bytes)`` is exir's only way to hand options from the
partitioner to ``preprocess`` (and they are stored in the ``.pte``). Keys:
``target`` (``host``/``mps``/``mps_emulated``, written by the partitioner), ``runtime``
(``etmetal``/``upstream``: which runtime the program is for; written by the partitioner
only when it is not the target's default, so programs for upstream carry no new key),
``method_name`` (upstream's key, used in messages), ``codesign_identity`` (macOS only),
``share_weights`` (``1``/``0``: store each constant once across methods, in the
shared-weights layout only etmetal's runtime reads; default: on for ``host`` programs for
etmetal's runtime, off otherwise; ``0`` opts out) and ``share_mutable_buffers`` (``1``:
methods share one copy of each mutable buffer with the same name; default off, needs the
shared layout).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from executorch.exir.backend.compile_spec_schema import CompileSpec

from etmetal.common.targets import (
    CODESIGN_SPEC_KEY,
    COMPILE_SPEC_KEYS,
    ETMETAL_RUNTIME,
    HOST,
    METHOD_NAME_SPEC_KEY,
    MPS_EMULATED,
    RUNTIME_SPEC_KEY,
    SHARE_MUTABLE_BUFFERS_KEY,
    SHARE_WEIGHTS_KEY,
    TARGET_SPEC_KEY,
    MetalTarget,
    get_target,
)

__all__ = [
    "KNOWN_KEYS",
    "SHARE_MUTABLE_BUFFERS_KEY",
    "SHARE_WEIGHTS_KEY",
    "MetalCompileOptions",
    "check_compile_specs",
    "parse_compile_specs",
    "shares_weights",
    "with_target",
]

KNOWN_KEYS = COMPILE_SPEC_KEYS
_FLAGS = {"1": True, "true": True, "0": False, "false": False}


@dataclass(frozen=True)
class MetalCompileOptions:
    target: MetalTarget | None = None  # None: no target key (lowered without the partitioner)
    runtime: str | None = None  # None: the target's default
    method_name: str | None = None
    codesign_identity: str | None = None
    share_weights: bool | None = None  # None: the default (see shares_weights)
    share_mutable_buffers: bool = False


def check_compile_specs(compile_specs: object) -> list[CompileSpec]:
    """A list of ``CompileSpec`` or a TypeError that names the offending element."""
    if compile_specs is None:
        return []
    if isinstance(compile_specs, (CompileSpec, dict, str, bytes)) or not isinstance(
        compile_specs, Iterable
    ):
        raise TypeError(
            "compile_specs must be a list of executorch.exir.backend.compile_spec_schema."
            f"CompileSpec, got {type(compile_specs).__name__}; e.g. "
            "[CompileSpec('codesign_identity', b'-')]"
        )
    specs = list(compile_specs)
    for i, spec in enumerate(specs):
        if not isinstance(spec, CompileSpec):
            raise TypeError(
                f"compile_specs[{i}] is a {type(spec).__name__} ({spec!r}), not a CompileSpec; "
                "wrap it as CompileSpec(key: str, value: bytes)"
            )
        if not isinstance(spec.key, str) or not isinstance(spec.value, (bytes, bytearray)):
            raise TypeError(
                f"compile_specs[{i}] has key {spec.key!r} ({type(spec.key).__name__}) and value "
                f"of type {type(spec.value).__name__}; a CompileSpec needs a str key and a "
                "bytes value, e.g. CompileSpec('codesign_identity', '-'.encode())"
            )
        if spec.key not in KNOWN_KEYS:
            raise ValueError(
                f"compile_specs[{i}] has unknown key {spec.key!r}; the Metal backend "
                f"understands {', '.join(KNOWN_KEYS)}"
            )
    return specs


def parse_compile_specs(compile_specs: object) -> MetalCompileOptions:
    values: dict[str, str] = {}
    for spec in check_compile_specs(compile_specs):
        try:
            values[spec.key] = bytes(spec.value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"compile spec {spec.key!r} is not UTF-8 text: {exc}") from None
    # the target name enters from bytes here: checked once, a record from then on
    name = values.get(TARGET_SPEC_KEY)
    return MetalCompileOptions(
        target=get_target(name) if name is not None else None,
        runtime=values.get(RUNTIME_SPEC_KEY),
        method_name=values.get(METHOD_NAME_SPEC_KEY),
        codesign_identity=values.get(CODESIGN_SPEC_KEY),
        share_weights=_flag(values, SHARE_WEIGHTS_KEY),
        share_mutable_buffers=bool(_flag(values, SHARE_MUTABLE_BUFFERS_KEY)),
    )


def _flag(values: dict[str, str], key: str) -> bool | None:
    if key not in values:
        return None
    flag = _FLAGS.get(values[key].strip().lower())
    if flag is None:
        raise ValueError(f"compile spec {key!r} must be b'1' or b'0', got {values[key]!r}")
    return flag


def shares_weights(options: MetalCompileOptions, target: MetalTarget, runtime: str) -> bool:
    """Whether a partition stores its constants one by one (the shared-weights layout).

    Default (``share_weights`` not given): yes for a ``host`` program meant for etmetal's
    runtime, the only runtime that reads the layout; the Metal targets keep upstream's
    one-blob layout (ExecuTorch's Metal runtime reads it, and their constants live on the
    device). ``share_weights`` ``0`` is the opt-out. A ValueError names what cannot be
    honoured: sharing asked for elsewhere, or ``share_mutable_buffers`` without sharing
    (``mps_emulated`` for etmetal: its one blob's buffers are shared by the stock runtime's
    backend)."""
    requested = options.share_weights
    target = get_target(target)
    shared = target is HOST and runtime == ETMETAL_RUNTIME
    if requested and not shared:
        raise ValueError(
            f"share_weights is implemented for target {HOST.name!r} with runtime "
            f"{ETMETAL_RUNTIME!r} only, not target {target.name!r} with runtime {runtime!r} "
            "(ExecuTorch's Metal runtime reads one weights blob per partition); drop the "
            f"compile spec or lower for {HOST.name!r}"
        )
    if requested is not None:
        shared = requested
    # the emulated Metal device keeps one blob, and etmetal's backend for the stock runtime
    # shares its buffers by name across the program's methods (stock_constants.cpp)
    one_blob_shares = (
        target is MPS_EMULATED and runtime == ETMETAL_RUNTIME and requested is not False
    )
    if options.share_mutable_buffers and not shared and not one_blob_shares:
        raise ValueError(
            "share_mutable_buffers needs the shared-weights layout (share_weights), which "
            f"target {target.name!r} with runtime {runtime!r} does not use"
            + (" (share_weights is 0)" if requested is False else "")
        )
    return shared


def with_target(
    compile_specs: list[CompileSpec], target: MetalTarget, runtime: str | None = None
) -> list[CompileSpec]:
    """``compile_specs`` with the ``target`` key set to ``target`` (replacing any other) and
    the ``runtime`` key set to ``runtime`` (dropped when None: the target's default)."""
    kept = [s for s in compile_specs if s.key not in (TARGET_SPEC_KEY, RUNTIME_SPEC_KEY)]
    specs = [*kept, CompileSpec(TARGET_SPEC_KEY, get_target(target).name.encode("utf-8"))]
    if runtime is not None:
        specs.append(CompileSpec(RUNTIME_SPEC_KEY, runtime.encode("utf-8")))
    return specs
