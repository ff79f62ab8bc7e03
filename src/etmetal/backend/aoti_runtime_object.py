"""torch's AOTI runtime interface, compiled once per build recipe instead of in every wrapper.

Every wrapper ``.cpp`` Inductor generates pastes torch's ``interface.cpp`` (the C ABI a
runner calls, ``AOTInductorModelContainerCreateWithDevice`` and the rest) right after its
``#include`` lines, and through it instantiates the model container and
``AOTInductorModelBase<AOTInductorModel>``, ``std::regex`` included. That text is the same
for every model, yet compiling it is more than half of a small model's wrapper build.

So a wrapper is split in two translation units with the same flags:

- the *runtime object*: the wrapper's includes, torch's interface text and an explicit
  instantiation of ``AOTInductorModelBase<AOTInductorModel>``. It depends on no model (it
  calls the model's constructor, ``run_impl`` and ``const_run_impl`` by symbol, which every
  wrapper defines), so it is built once per (compiler, flags, text) into the cache
  (:mod:`etmetal.common.cache`, kind ``aoti-runtime``) and linked into every ``.so``;
- the *model part*: the wrapper without the interface text, with an ``extern template``
  declaration so that the base class is not instantiated again.

The ``.so`` holds the same code as before (same dynamic symbols, same results:
``test/backend/test_aoti_runtime_object.py``). A wrapper whose interface text is not torch's
verbatim, or a runtime object that does not build, is compiled whole, as Inductor wrote it.
``ETMETAL_SHARED_AOTI_RUNTIME=0`` turns the split off.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from etmetal.common.cache import ContentCache
from etmetal.common.native_build import compiler_version, cpu_identity

from .wrapper_pch import INCLUDE_LINE

log = logging.getLogger(__name__)

ENV = "ETMETAL_SHARED_AOTI_RUNTIME"  # "0": compile torch's interface into every wrapper
KIND = "aoti-runtime"
OBJECT = "aoti_runtime.o"
FORMAT = 1  # bump when the split or the entry's layout changes (it is in the AOTI cache key)
_BASE = "torch::aot_inductor::AOTInductorModelBase<torch::aot_inductor::AOTInductorModel>"
_CONTAINER = "#include <torch/csrc/inductor/aoti_runtime/model_container.h>\n"


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("0", "")


@lru_cache(maxsize=1)
def interface_text() -> str:
    """torch's ``interface.cpp``, the text Inductor pastes into every wrapper."""
    path = Path(torch._inductor.__file__).parent / "codegen" / "aoti_runtime" / "interface.cpp"
    return path.read_text()


@dataclass(frozen=True)
class SplitWrapper:
    model_source: str  # the wrapper without torch's interface text
    runtime_source: str  # the includes, the interface text, the base class instantiated


def split(source: str) -> SplitWrapper | None:
    """``source`` (a generated wrapper) as its model part and its runtime object's source;
    None unless torch's interface text follows the wrapper's ``#include`` lines verbatim,
    once (then the runtime object is the same for every wrapper with those includes)."""
    interface = interface_text()
    at = source.find(interface)
    if at < 0 or source.find(interface, at + 1) >= 0:
        return None
    prefix = source[:at]
    if not all(INCLUDE_LINE.match(line) for line in prefix.splitlines() if line.strip()):
        return None
    rest = source[at + len(interface) :]
    return SplitWrapper(
        model_source=f"{prefix}{_CONTAINER}extern template class {_BASE};\n{rest}",
        runtime_source=f"{prefix}{interface}\ntemplate class {_BASE};\n",
    )


def runtime_object(
    cxx: str, flags: Sequence[str], source: str, build: Callable[[Path, Path], None]
) -> Path:
    """The cached runtime object for ``source`` compiled by ``cxx`` with ``flags``;
    ``build(cpp, out_dir)`` compiles ``cpp`` into ``out_dir/aoti_runtime.o``."""
    h = hashlib.sha256()
    for part in (str(FORMAT), cxx, compiler_version(cxx), cpu_identity(), *flags, source):
        h.update(part.encode() + b"\0")

    def make(out: Path) -> None:
        cpp = out / "aoti_runtime.cpp"
        cpp.write_text(source)
        build(cpp, out)
        if not (out / OBJECT).is_file():
            raise RuntimeError(f"the runtime object's build wrote no {OBJECT}")
        cpp.unlink()

    entry, _ = ContentCache(KIND).get_or_create(
        h.hexdigest()[:32], make, stamp=f"aoti-runtime {FORMAT}"
    )
    return entry / OBJECT


def compile_object(cmd: Sequence[str]) -> None:
    """Run a compile command; a failure raises with the compiler's last lines."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exit {proc.returncode}: {proc.stderr[-1500:]}")


# --- torch's own build of a host (or real mps) wrapper -------------------------------------

_state = threading.local()


@contextlib.contextmanager
def shared_runtime_in_inductor_builds() -> Iterator[None]:
    """While Inductor AOT-compiles (``torch._inductor.aot_compile``) in this thread, its
    wrapper compile builds the model part and its link adds the runtime object."""
    from torch._inductor import codecache

    if not enabled():
        yield
        return
    stock = codecache.CppBuilder
    _state.wrappers = {}  # the wrapper object's path -> the runtime object to link with it
    codecache.CppBuilder = _builder_class(stock)
    try:
        yield
    finally:
        codecache.CppBuilder = stock
        _state.wrappers = None


def _builder_class(stock: type) -> type:
    class SplittingBuilder(stock):  # type: ignore[misc, valid-type]
        """torch's ``CppBuilder``, building a wrapper's two parts (module doc)."""

        def __init__(self, name: str, sources: str | list[str], BuildOption, output_dir=""):
            wrappers = getattr(_state, "wrappers", None)
            if wrappers is not None and isinstance(sources, str):
                sources = self._model_part(stock, name, sources, BuildOption, output_dir)
            elif wrappers is not None:
                sources = [*sources, *(str(wrappers[s]) for s in sources if s in wrappers)]
            super().__init__(name, sources, BuildOption, output_dir)

        @staticmethod
        def _model_part(stock: type, name: str, source: str, option, output_dir: str) -> str:
            if not source.endswith(".wrapper.cpp") or not option.get_compile_only():
                return source
            parts = split(Path(source).read_text())
            if parts is None:
                log.debug("etmetal: %s has no interface text to share; compiled whole", source)
                return source
            probe = stock("aoti_runtime", "SOURCE.cpp", option, "OUT").get_command_line()

            def build(cpp: Path, out: Path) -> None:
                stock("aoti_runtime", str(cpp), option, str(out)).build()

            try:
                obj = runtime_object(option.get_compiler(), [probe], parts.runtime_source, build)
            except Exception as exc:  # noqa: BLE001 - never let the split fail a compile
                log.warning("etmetal: compiling %s whole (its runtime object: %s)", source, exc)
                return source
            model = Path(source).with_suffix(".model.cpp")
            model.write_text(parts.model_source)
            target = stock(name, str(model), option, output_dir).get_target_file_path()
            _state.wrappers[target] = obj
            return str(model)

    return SplittingBuilder
