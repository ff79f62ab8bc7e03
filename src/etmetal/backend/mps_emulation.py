"""Run Inductor's real ``mps`` code generation on a machine without an MPS device.

Inductor generates Metal kernels and the Metal C++ wrapper from the graph alone; it
needs the device for little else. This module supplies what it asks for, and only
for the duration of one compile (:func:`emulated_mps_codegen` undoes everything on
exit, also when the compile fails):

1. Inductor's pattern tables (``joint_graph.lazy_init``, ``freezing_patterns.lazy_init``)
   are built by tracing small examples with *real* tensors on the input's device; on
   ``mps`` that cannot allocate here, so they are built on the CPU (they are
   device-independent pattern graphs).
2. ``torch._C._mps_get_core_count`` / ``_mps_get_name`` answer as a Mac would (the
   Metal codegen sizes reductions by the GPU core count).
3. ``cpp_wrapper_gpu.get_gpu_type`` answers ``mps``: with no GPU it answers
   ``"cuda"`` and the wrapper would carry CUDA's kernel-loading helpers instead of the
   ``MetalShaderLibrary.h`` header a Mac's wrapper includes.
4. The program's constants are *fake* ``mps`` tensors (a real ``mps`` tensor cannot be
   made on Linux), each registered with the real CPU tensor holding its values, keyed
   by the fake's storage so views and ``nn.Parameter`` wrappers resolve too. Where
   Inductor reads constant values (inlining small constants via ``tolist``/``item``,
   deduplicating constants by storage, serializing the weights blob) it gets the real
   values; without this, every fake storage has address 0, so constants of equal shape
   would be merged into one, and the weights blob would be unreadable. The wrapper's
   constant table (device, offset, size of each constant) is generated from the fakes,
   as on a Mac from the ``mps`` tensors; only the weights serialization, which runs in
   ``AotCodeCompiler.compile`` after code generation, reads the real tensors.
5. Inductor's joint-graph constant folding (``UniformValueConstantFolder``) evaluates
   constant subgraphs with real tensors on their device (``full(..., device=mps)``, the
   scale of an attention): here it evaluates them on the CPU with the constants' real
   values. Only the folded *values* are kept (the replacement ``full`` takes its device
   from the graph), so the generated code is the one a Mac gets.
6. The decompositions a macOS build of torch makes on ``mps`` and a Linux build does not
   (:mod:`.mps_decompositions`: attention becomes the Metal math fallback), and those of
   Inductor's that index with Python (``index_select``), apply while Inductor traces.
7. torch's fake kernels that do real work on the fake tensor's device, which needs an
   MPS build (the convolution's ``contiguous()``), run on CPU stand-ins
   (:mod:`.mps_fake_impls`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.export import ExportedProgram
from torch.utils._python_dispatch import TorchDispatchMode

from etmetal.common.targets import CPU_DEVICE, METAL_DEVICE

from .mps_decompositions import MacMpsDecompositions, inductor_decompositions_for_mps
from .mps_fake_impls import cpu_stand_ins

# what the emulated device says it is (a base M1: the core count sizes reductions)
EMULATED_CORE_COUNT = 8
EMULATED_NAME = "Apple M1 (etmetal emulated)"


class RealConstants:
    """The real CPU tensor behind each fake ``mps`` constant, keyed by the fake's storage."""

    def __init__(self) -> None:
        self._by_storage: dict[int, torch.Tensor] = {}
        self._by_name: dict[str, torch.Tensor] = {}
        # the fakes stay referenced so their storage keys are never reused
        self._fakes: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self._fakes)

    @staticmethod
    def _key(fake: torch.Tensor) -> int:
        return fake.untyped_storage()._cdata

    def add(self, name: str, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Register ``real`` for ``fake`` (made by ``empty_strided`` with ``real``'s
        geometry): ``real`` is copied into a storage of exactly that geometry, so that
        storage sizes and offsets Inductor reads off the fake hold for the real one."""
        with torch.utils._python_dispatch._disable_current_modes():
            real = real.detach()
            if real.storage_offset() != 0 or (
                real.untyped_storage().nbytes() != fake.untyped_storage().nbytes()
            ):
                real = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype).copy_(real)
        self._by_storage[self._key(fake)] = real
        self._by_name[name] = real
        self._fakes.append(fake)

    def real_of(self, fake: torch.Tensor) -> torch.Tensor | None:
        """The real values a fake constant (or a view of one) stands for; None if unknown."""
        if not isinstance(fake, FakeTensor):
            return None
        base = self._by_storage.get(self._key(fake))
        if base is None:
            return None
        with torch.utils._python_dispatch._disable_current_modes():
            return base.as_strided(fake.shape, fake.stride(), fake.storage_offset())

    def real_by_name(self, name: str) -> torch.Tensor | None:
        return self._by_name.get(name)


class _Unresolved(Exception):
    """A fake tensor without real values reached constant folding: do not fold it."""


class _FoldOnCpu(TorchDispatchMode):
    """Runs ops asked for on ``mps`` on the CPU, with fake constants replaced by their
    real values (constant folding computes real values; there is no mps device here)."""

    def __init__(self, reals: RealConstants) -> None:
        super().__init__()
        self.reals = reals

    def _real(self, value: Any) -> Any:
        if isinstance(value, FakeTensor):
            real = self.reals.real_of(value)
            if real is None:
                raise _Unresolved
            return real
        if isinstance(value, torch.device) and value.type == METAL_DEVICE:
            return torch.device(CPU_DEVICE)
        if isinstance(value, str) and value.startswith(METAL_DEVICE):
            return CPU_DEVICE
        return value

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args, kwargs = pytree.tree_map(self._real, (args, kwargs or {}))
        return func(*args, **kwargs)


def _fake_mps_like(mode: FakeTensorMode, value: torch.Tensor) -> torch.Tensor:
    with mode:
        return torch.empty_strided(
            tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device=METAL_DEVICE
        )


def _program_fake_mode(ep: ExportedProgram) -> FakeTensorMode:
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, FakeTensor):
            return val.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


def fake_mps_module(
    ep: ExportedProgram,
) -> tuple[torch.fx.GraphModule, tuple[Any, ...], RealConstants]:
    """``ep``'s module with every tensor on a fake ``mps`` device, the user inputs to
    compile it with, and the real values of its constants. ``ep`` is left unchanged.

    The counterpart of ``torch.export.passes.move_to_device_pass`` for a device this
    machine does not have: moving a tensor to ``mps`` fails here, so parameters, buffers,
    constants, graph metadata and device arguments are replaced by fake ``mps`` tensors
    of the same sizes, strides and dtype, made in the program's own fake mode (symbolic
    sizes stay symbolic).
    """
    mode = _program_fake_mode(ep)
    reals = RealConstants()
    mps = torch.device(METAL_DEVICE)

    def fake_of(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type != METAL_DEVICE:
            return _fake_mps_like(mode, value)
        return value

    gm = ep.module()  # a fresh module: a copy of the graph over ep's (real) tensors
    for name, value in list(gm.named_parameters(remove_duplicate=False)) + list(
        gm.named_buffers(remove_duplicate=False)
    ):
        _replace_attr(gm, name, fake_of(value), value, reals)
    for name, value in list(vars(gm).items()):
        # lifted tensor constants come back as plain tensor attributes
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            _replace_attr(gm, name, fake_of(value), value, reals)
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if isinstance(node.kwargs.get("device"), (torch.device, str)):
                node.kwargs = {**node.kwargs, "device": mps}
            if node.op == "call_function" and node.target is torch.ops.aten.to.device:
                node.args = (node.args[0], mps, *node.args[2:])
            node.meta["val"] = pytree.tree_map_only(torch.Tensor, fake_of, node.meta.get("val"))
    gm.recompile()
    user_inputs = set(ep.graph_signature.user_inputs)
    inputs = tuple(
        fake_of(n.meta["val"])
        for n in ep.graph.nodes
        if n.op == "placeholder" and n.name in user_inputs
    )
    return gm, inputs, reals


def _replace_attr(
    gm: torch.nn.Module, name: str, fake: torch.Tensor, real: torch.Tensor, reals: RealConstants
) -> None:
    owner_name, _, attr = name.rpartition(".")
    owner = gm.get_submodule(owner_name) if owner_name else gm
    reals.add(name, fake, real)
    if isinstance(real, torch.nn.Parameter):
        # a parameter that requires grad makes autograd look up the (absent) mps device
        owner._parameters[attr] = torch.nn.Parameter(fake, requires_grad=False)
    elif attr in owner._buffers:
        owner._buffers[attr] = fake
    else:
        setattr(owner, attr, fake)


@contextlib.contextmanager
def emulated_mps_codegen(reals: RealConstants) -> Iterator[None]:
    """The patches (see the module doc), applied for one compile and always undone."""
    from unittest import mock

    import torch._inductor.codegen.cpp_wrapper_gpu as cpp_wrapper_gpu
    import torch._inductor.fx_passes.freezing_patterns as freezing_patterns
    import torch._inductor.fx_passes.joint_graph as joint_graph
    import torch._inductor.graph as inductor_graph
    from torch._inductor.codecache import AotCodeCompiler
    from torch._inductor.graph import GraphLowering

    cpu = torch.device("cpu")
    joint_init, freezing_init = joint_graph.lazy_init, freezing_patterns.lazy_init
    same_tensor = inductor_graph.is_same_tensor
    original_value = GraphLowering.get_original_value_of_constant
    aot_compile = AotCodeCompiler.compile.__func__
    serializing = [False]
    fake_tolist = FakeTensor.tolist
    fold_node = joint_graph.UniformValueConstantFolder.run_node

    def fold_on_cpu(self: Any, node: torch.fx.Node) -> Any:
        try:
            with _FoldOnCpu(reals):
                return fold_node(self, node)
        except _Unresolved:
            return self.unknown_value

    def is_same_tensor(data: torch.Tensor, value: torch.Tensor) -> bool:
        a, b = reals.real_of(data), reals.real_of(value)
        if a is None and b is None:
            return same_tensor(data, value)
        return a is not None and b is not None and same_tensor(a, b)

    def serialize(cls: type, *args: Any, **kwargs: Any) -> Any:
        serializing[0] = True
        try:
            return aot_compile(cls, *args, **kwargs)
        finally:
            serializing[0] = False

    def real_value(self: GraphLowering, name: str) -> torch.Tensor:
        value = original_value(self, name)
        if not serializing[0] or not isinstance(value, FakeTensor):
            return value
        real = reals.real_of(value)
        if real is None:  # a copy Inductor made (a mutated buffer's original value)
            real = reals.real_by_name(str(self.allocated_constant_name.get(name, name)))
            if real is not None and (real.shape != value.shape or real.dtype != value.dtype):
                real = None
        if real is None:
            raise RuntimeError(
                f"mps_emulated: Inductor's constant {name!r} (from "
                f"{self.allocated_constant_name.get(name)!r}) has no real value: it was "
                "created during the compile from a fake mps tensor, so its weights cannot be "
                "written. Please report the model."
            )
        return real

    def tolist(self: FakeTensor) -> Any:
        real = reals.real_of(self)
        return fake_tolist(self) if real is None else real.tolist()

    def item(self: FakeTensor) -> Any:
        real = reals.real_of(self)
        if real is None:
            return torch.Tensor.item(self)
        return real.item()

    patches = [
        mock.patch.object(joint_graph, "lazy_init", lambda *_a, **_k: joint_init(cpu)),
        mock.patch.object(freezing_patterns, "lazy_init", lambda *_a, **_k: freezing_init(cpu)),
        mock.patch.object(
            torch._C, "_mps_get_core_count", lambda: EMULATED_CORE_COUNT, create=True
        ),
        mock.patch.object(torch._C, "_mps_get_name", lambda: EMULATED_NAME, create=True),
        mock.patch.object(cpp_wrapper_gpu, "get_gpu_type", lambda: METAL_DEVICE),
        mock.patch.object(inductor_graph, "is_same_tensor", is_same_tensor),
        mock.patch.object(GraphLowering, "get_original_value_of_constant", real_value),
        mock.patch.object(AotCodeCompiler, "compile", classmethod(serialize)),
        mock.patch.object(FakeTensor, "tolist", tolist),
        mock.patch.object(FakeTensor, "item", item, create=True),
        mock.patch.object(joint_graph.UniformValueConstantFolder, "run_node", fold_on_cpu),
        MacMpsDecompositions(),
        inductor_decompositions_for_mps(),
        cpu_stand_ins(),
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield
