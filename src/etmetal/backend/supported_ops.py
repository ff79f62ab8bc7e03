"""What one Metal target can compile, decided per node before lowering.

AOTInductor turns most ATen operators into generated kernels. The rest become
*extern* calls into the AOTI C-shim ABI (``aoti_torch_<device>_<op>``): matrix
products and convolution go out by design, and operators without an Inductor
lowering fall back to a shim. A ``.so`` built without libtorch can only call shims
the runtime provides, so a node is delegatable only when everything Inductor will
emit for it is generated code or one of the target's supported fallbacks.

To know that ahead of time, each node is re-traced alone on fake tensors through
Inductor's own decomposition table (the same table ``aot_compile`` uses), and each
resulting operator is classified the way Inductor's lowering would treat it.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from etmetal.backend.passes.replace_view_copy_with_view_pass import VIEW_OF_COPY
from etmetal.common.fallback_table import (
    ETMETAL_RUNTIME,
    FALLBACKS,
    PROXY_EXECUTOR_SHIM,
    etmetal_fallback_shims,
    fallback_shims,
    runtime_shims,
)
from etmetal.common.targets import METAL_DEVICE

from .edge_ops import aten_overload
from .targets import MetalTarget, get_target, resolve_runtime

log = logging.getLogger(__name__)

aten = torch.ops.aten

# Fallback shims each target's runtime implements (the names the .so imports)
SUPPORTED_FALLBACKS: dict[str, frozenset[str]] = {t: fallback_shims(t) for t in FALLBACKS}

# Inductor lowerings that always emit an extern call (no generated kernel) unless
# autotuning picks a template; the suffix of the shim each one calls.
EXTERN_LOWERINGS: dict[Any, str] = {
    aten.mm.default: "mm_out",
    aten.addmm.default: "addmm_out",
    aten.bmm.default: "bmm_out",
    aten.baddbmm.default: "baddbmm_out",
    aten.convolution.default: "convolution",
    aten._int_mm.default: "_int_mm_out",
    aten.mkldnn_rnn_layer.default: "mkldnn_rnn_layer",
}

# Lowerings that fall back to a shim depending on sizes, dtypes or device (Inductor
# decides while lowering); judged by the fallback they may take.
MAY_FALL_BACK: dict[Any, str] = {
    aten.sort.default: "sort_stable",
    aten.sort.stable: "sort_stable",
    aten.topk.default: "topk",
    aten.kthvalue.default: "kthvalue",
    aten.median.default: "median",
    aten.median.dim: "median_dim",
    aten.mode.default: "mode",
    aten.cumsum.default: "cumsum",
    aten.cumprod.default: "cumprod",
    aten.logcumsumexp.default: "logcumsumexp",
    aten.cummax.default: "cummax",
    aten.cummin.default: "cummin",
    aten._unsafe_masked_index.default: "_unsafe_masked_index",
    aten._adaptive_avg_pool2d.default: "_adaptive_avg_pool2d",
    aten.adaptive_max_pool2d.default: "adaptive_max_pool2d",
}
# average pools fall back to ATen for windows over 25 elements that overlap (Inductor's
# _avg_poolnd)
_AVG_POOLS = {aten.avg_pool2d.default: "avg_pool2d", aten.avg_pool3d.default: "avg_pool3d"}


def _avg_pool_falls_back(node: torch.fx.Node) -> bool:
    dims = 2 if node.target is aten.avg_pool2d.default else 3
    args = list(node.args) + [None] * 3
    kernel = list(args[1]) * (dims if len(args[1]) == 1 else 1)
    stride = list(args[2] or node.kwargs.get("stride") or kernel)
    stride = stride * (dims if len(stride) == 1 else 1)
    window = 1
    for k in kernel:
        window *= int(k)
    return window > 25 and any(int(k) != int(s) for k, s in zip(kernel, stride))


# integer powers are not generated
_INTEGER_POW = {aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar}

# copy ops the view rewrite pass turns into views (or view + clone when a view
# would be unsafe), so Inductor never sees the copy form
VIEW_FORMS: dict[Any, Any] = VIEW_OF_COPY

# ExecuTorch's dim-order ops, which the dim-order pass rewrites to their ATen forms
_DIM_ORDER_FORMS = {
    "_to_dim_order_copy": aten._to_copy.default,
    "_clone_dim_order": aten.clone.default,
}

_SYM_MODULES = ("_operator", "operator", "math")
_SYM_FUNCTIONS = (torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_float, torch.sym_int)
_CONTROL_FLOW = (torch.ops.higher_order.cond, torch.ops.higher_order.while_loop)
# a mutating custom op, functionalized by export (v2 since torch 2.6)
_AUTO_FUNCTIONALIZED = (
    torch.ops.higher_order.auto_functionalized,
    torch.ops.higher_order.auto_functionalized_v2,
)
_NO_FLOAT64 = (torch.float64, torch.complex64, torch.complex128)


@dataclass(frozen=True)
class OpVerdict:
    """Whether a node can go to the delegate, and why (the report shows ``reason``)."""

    supported: bool
    reason: str
    kernels: tuple[str, ...] = field(default=())


def fallback_shim_name(op: torch._ops.OpOverload, device: str) -> str:
    """The shim a fallback to ``op`` calls, named the way Inductor's C++ wrapper names it."""
    if op.namespace != "aten":
        return f"aoti_torch_{device}_{op._schema.name.split('::')[-1]}"
    base, overload = op.__name__.split(".")[0], op._overloadname
    name = base if overload == "default" else f"{base}_{overload}"
    from torchgen.aoti.fallback_ops import inductor_fallback_ops

    versions = inductor_fallback_ops.get(f"aten.{op.__name__}", {})
    latest = max((int(v[1:]) for v in versions if v.startswith("v")), default=1)
    if latest > 1:
        name = f"{name}_v{latest}"
    return f"aoti_torch_{device}_{name}"


def aten_form(target: Any) -> Any:
    """The ATen overload Inductor will see for a (possibly edge-dialect) node target."""
    op = aten_overload(target)
    if isinstance(op, torch._ops.OpOverload):
        if op.namespace == "dim_order_ops":
            return _DIM_ORDER_FORMS.get(op.__name__.split(".")[0], op)
        return VIEW_FORMS.get(op, op)
    return op


def _hint(value: Any) -> Any:
    if isinstance(value, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        return int(optimization_hint(value))
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        return value.node.hint
    return value


def has_c_shim(op: torch._ops.OpOverload) -> bool:
    """Whether Inductor calls a C shim for a fallback to ``op`` (else the proxy executor):
    ATen ops listed in torchgen's fallback table and internal ``_quantized`` ops have one,
    custom ops and the other ATen ops do not (Inductor's ``FallbackKernel.codegen``)."""
    if op.namespace == "_quantized":
        return True
    if op.namespace != "aten":
        return False
    from torchgen.aoti.fallback_ops import inductor_fallback_ops

    return str(op) in inductor_fallback_ops


class TargetCapabilities:
    """Answers ``check_node`` for one target and runtime; results are cached per op and
    argument specs. ``runtime`` (``etmetal``/``upstream``, None: the target's default)
    decides whether operators without a C shim may go through the proxy executor."""

    def __init__(self, target: MetalTarget | str, runtime: str | None = None) -> None:
        record = get_target(target)
        self.target = record.name
        self.device = record.torch_device
        self.runtime = resolve_runtime(runtime, record)
        self.supported_fallbacks = SUPPORTED_FALLBACKS[record.name]
        self.runtime_shims = runtime_shims(record, self.runtime)
        self._cache: dict[Any, OpVerdict] = {}
        from torch._inductor.decomposition import select_decomp_table

        self._decomps = select_decomp_table()
        if self.device == METAL_DEVICE:
            from .mps_decompositions import for_mps_tracing

            self._decomps = for_mps_tracing(self._decomps)

    # -- public -------------------------------------------------------------
    def check_node(self, node: torch.fx.Node) -> OpVerdict:
        if node.op != "call_function":
            return OpVerdict(False, f"{node.op} nodes are not operators")
        target = node.target
        if target is operator.getitem:
            src = node.args[0]
            if isinstance(src, torch.fx.Node) and src.op == "call_function":
                return self.check_node(src)
            return OpVerdict(True, "getitem")
        if target in _CONTROL_FLOW:
            # torch 2.13's aot_compile fails on edge-dialect branch graphs (functionalizing
            # the cond raises "FunctionalTensor on its own"), so control flow stays out
            # until that works; _check_control_flow judges the branches once it does
            verdict = self._check_control_flow(node)
            return OpVerdict(
                False,
                f"{target.name()} is not compiled by AOTInductor from edge dialect here"
                + ("" if verdict.supported else f" (and {verdict.reason})"),
            )
        if target in _AUTO_FUNCTIONALIZED:
            return self._check_mutating_op(node)
        if isinstance(target, torch._ops.HigherOrderOperator):
            return OpVerdict(False, f"higher-order op {target.name()} has no AOTI lowering here")
        raw = aten_overload(target)
        if isinstance(raw, torch._ops.OpOverload) and raw.namespace == "dim_order_ops":
            from etmetal.backend.passes.dim_order_to_aten_pass import convertible

            if not convertible(node):
                return OpVerdict(False, f"{raw} with a dim order no memory format expresses")
        op = aten_form(target)
        if not isinstance(op, torch._ops.OpOverload):
            if getattr(op, "__module__", None) in _SYM_MODULES or op in _SYM_FUNCTIONS:
                # SymInt arithmetic (operator.mul on sizes, ...) is generated inline
                return OpVerdict(True, "symbolic arithmetic")
            return OpVerdict(False, f"{op} is not an operator Inductor lowers")
        if op.namespace == "dim_order_ops":
            return OpVerdict(False, f"{op} has no ATen form for Inductor")
        if self.device == METAL_DEVICE:
            for dtype in _node_dtypes(node):
                if dtype in _NO_FLOAT64:
                    return OpVerdict(False, f"MPS has no {dtype} support")
        key = self._cache_key(op, node)
        verdict = self._cache.get(key) if key is not None else None
        if verdict is None:
            verdict = self._check_op(op, node)
            if key is not None:
                self._cache[key] = verdict
        return verdict

    # -- internals ----------------------------------------------------------
    def _cache_key(self, op: Any, node: torch.fx.Node) -> Any:
        def spec(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return spec(a.meta.get("val"))
            if isinstance(a, torch.Tensor):
                return ("T", a.dtype, tuple(map(str, a.shape)), tuple(map(str, a.stride())))
            if isinstance(a, (list, tuple)):
                return tuple(spec(x) for x in a)
            return repr(a)

        try:
            return (op, spec(node.args), spec(dict(sorted(node.kwargs.items()))))
        except Exception:  # an unhashable or exotic argument: just don't cache
            return None

    def _check_op(self, op: torch._ops.OpOverload, node: torch.fx.Node) -> OpVerdict:
        try:
            traced = self._decompose(op, node)
        except torch._subclasses.fake_tensor.DynamicOutputShapeException:
            return OpVerdict(False, f"{op} has a data-dependent output shape")
        except Exception as exc:  # anything Inductor could not trace either
            return OpVerdict(False, f"{op} cannot be traced for Inductor: {type(exc).__name__}")
        kernels: list[str] = []
        for inner_node in traced:
            inner = inner_node.target
            shim = self._extern_shim(inner_node)
            if shim is None:
                continue
            via = "" if inner == op else f" (from {op})"
            if shim == PROXY_EXECUTOR_SHIM:
                if shim not in self.runtime_shims:
                    return OpVerdict(
                        False,
                        f"{inner}{via} has no C shim in torch's {self.device} ABI: Inductor "
                        f"would run it through the proxy executor, which the {self.runtime} "
                        "runtime does not have (runtime='etmetal' has one)",
                        (shim,),
                    )
                kernels.append(f"proxy executor: {inner}")
                continue
            if shim not in self.runtime_shims:
                # the emulated device's extra fallbacks: say how to get them
                hint = (
                    " (etmetal's runtime provides it: runtime='etmetal')"
                    if shim in etmetal_fallback_shims(self.target)
                    and self.runtime != ETMETAL_RUNTIME
                    else ""
                )
                return OpVerdict(
                    False,
                    f"Inductor would call fallback {shim} for {inner}{via}, which the "
                    f"{self.target} runtime does not provide{hint}",
                    (shim,),
                )
            kernels.append(shim)
        if kernels:
            return OpVerdict(True, "fallback " + ", ".join(sorted(set(kernels))), tuple(kernels))
        return OpVerdict(True, "generated kernel")

    def _extern_shim(self, node: torch.fx.Node) -> str | None:
        from torch._inductor import lowering

        op = node.target
        if not isinstance(op, torch._ops.OpOverload):
            return None
        if op in EXTERN_LOWERINGS:
            return f"aoti_torch_{self.device}_{EXTERN_LOWERINGS[op]}"
        if op in MAY_FALL_BACK:
            return f"aoti_torch_{self.device}_{MAY_FALL_BACK[op]}"
        if op in _AVG_POOLS and _avg_pool_falls_back(node):
            return f"aoti_torch_{self.device}_{_AVG_POOLS[op]}"
        if op in _INTEGER_POW:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and not val.is_floating_point():
                return fallback_shim_name(op, self.device)
        if op in lowering.fallbacks or op not in lowering.lowerings:
            name = fallback_shim_name(op, self.device)
            # a custom op the table lists by name has a C shim of its own (Inductor calls
            # it by name through aot_inductor.custom_ops_to_c_shims)
            if has_c_shim(op) or name in self.supported_fallbacks:
                return name
            return PROXY_EXECUTOR_SHIM
        return None

    def _decompose(self, op: torch._ops.OpOverload, node: torch.fx.Node) -> list[torch.fx.Node]:
        from torch._dispatch.python import enable_python_dispatcher
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        device = torch.device(self.device)

        def fake(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return fake(a.meta["val"])
            if isinstance(a, torch.Tensor):
                shape = [_hint(s) for s in a.shape]
                stride = [_hint(s) for s in a.stride()]
                with mode:
                    return torch.empty_strided(shape, stride, dtype=a.dtype, device=device)
            if isinstance(a, (list, tuple)):
                return type(a)(fake(x) for x in a)
            if isinstance(a, torch.device):
                return device
            return _hint(a)

        args, kwargs = fake(tuple(node.args)), {k: fake(v) for k, v in node.kwargs.items()}
        if op is aten._to_copy.default or op is aten.clone.default:
            kwargs.pop("dim_order", None)  # the dim-order pass turns it into memory_format

        def run(*flat: Any) -> Any:
            return op(*flat, **kwargs)

        with contextlib.ExitStack() as stack:
            # AOTAutograd traces for Inductor under the Python dispatcher, where a composite
            # op's Python kernel (``py_impl``) replaces its C++ one: upsample_bilinear2d.vec
            # then becomes index arithmetic Inductor generates, not the ATen op it would
            # run through the proxy executor. Trace the same way so the prediction agrees.
            stack.enter_context(enable_python_dispatcher())
            if self.device == METAL_DEVICE:  # what a macOS torch decomposes differently on mps
                from .mps_decompositions import MacMpsDecompositions
                from .mps_fake_impls import cpu_stand_ins

                stack.enter_context(MacMpsDecompositions())
                stack.enter_context(cpu_stand_ins())  # fake kernels that need an MPS build
            gm = make_fx(
                run,
                decomposition_table=self._decomps,
                tracing_mode="fake",
                _allow_non_fake_inputs=True,
            )(*args)
        return [n for n in gm.graph.nodes if n.op == "call_function"]

    def _check_mutating_op(self, node: torch.fx.Node) -> OpVerdict:
        """``auto_functionalized(op, ...)``: a custom op that writes an input. Inductor
        re-inplaces it and calls the op's shim with the mutated tensor as an argument."""
        op = aten_overload(node.args[0]) if node.args else None
        wrapper = node.target.name()
        if not isinstance(op, torch._ops.OpOverload) or op.namespace == "aten":
            return OpVerdict(False, f"{wrapper} of {op} is not compiled as a named shim here")
        shim = fallback_shim_name(op, self.device)
        if shim not in self.supported_fallbacks:
            return OpVerdict(
                False,
                f"{wrapper} of {op}: the {self.target} runtime has no shim {shim} for it",
                (shim,),
            )
        return OpVerdict(True, f"fallback {shim} (in place)", (shim,))

    def _check_control_flow(self, node: torch.fx.Node) -> OpVerdict:
        owner = node.graph.owning_module
        kernels: list[str] = []
        for arg in node.args:
            if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
                continue
            sub = getattr(owner, str(arg.target), None)
            if not isinstance(sub, torch.fx.GraphModule):
                continue
            for inner in sub.graph.nodes:
                if inner.op != "call_function":
                    continue
                verdict = self.check_node(inner)
                if not verdict.supported:
                    return OpVerdict(
                        False, f"branch {arg.target} of {node.target.name()}: {verdict.reason}"
                    )
                kernels.extend(verdict.kernels)
        return OpVerdict(True, f"{node.target.name()} with supported branches", tuple(kernels))


def _node_dtypes(node: torch.fx.Node) -> set[torch.dtype]:
    dtypes: set[torch.dtype] = set()

    def visit(v: Any) -> None:
        if isinstance(v, torch.fx.Node):
            visit(v.meta.get("val"))
        elif isinstance(v, torch.Tensor):
            dtypes.add(v.dtype)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    visit(node.meta.get("val"))
    visit(list(node.args))
    return dtypes
