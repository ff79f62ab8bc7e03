"""``etmetal.backend_config()``: an ``ExecutorchBackendConfig`` with a layout-safe
``view_copy`` lowering, so ``edge.to_executorch(etmetal.backend_config())`` is all a user
writes.

Where the pass goes: ``to_executorch`` runs ``config.passes``, then ``SpecPropPass`` (which
rebuilds every TensorSpec, so a ``memory.view`` made earlier would lose the spec that
shares its base's storage), then the stock ``view_copy`` replacement when
``remove_view_copy`` is set, then ``sym_shape_eval_pass``, ``to_out_var_pass`` and memory
planning. The only per-config hook between spec propagation and the stock replacement's
slot is ``sym_shape_eval_pass``: this config turns the stock replacement off and runs
``LayoutSafeViewCopyPass`` first inside that hook, exactly where the stock one would have
run (symbolic shapes still symbolic, before out-variants and memory planning), then
``LegalizeDimOrdersPass``, which sees the views already decided.
"""

from __future__ import annotations

from typing import Any

from executorch.exir import ExecutorchBackendConfig
from executorch.exir.pass_manager import PassType
from torch.fx.passes.infra.pass_base import PassBase

from etmetal.layout.layout_safe_view_copy_pass import LayoutSafeViewCopyPass
from etmetal.layout.legalize_dim_orders_pass import LegalizeDimOrdersPass
from etmetal.layout.view_copy_then_sym_shape_eval_pass import ViewCopyThenSymShapeEvalPass


class _PerMethodPasses(dict):
    """A per-method pass dict whose default (for methods it does not name) also runs the
    view_copy lowering; ``to_executorch`` looks passes up with ``.get(name, default)``."""

    def __init__(self, passes: dict[str, PassType], wrap):
        super().__init__({name: wrap(p) for name, p in passes.items()})
        self._wrap = wrap

    def get(self, name: Any, default: Any = None) -> Any:
        if name in self:
            return self[name]
        return None if default is None else self._wrap(default)


def backend_config(
    *,
    remove_view_copy: bool = True,
    legalize_for_stock_kernels: bool = True,
    **kwargs: Any,
) -> ExecutorchBackendConfig:
    """An ``ExecutorchBackendConfig`` whose ``view_copy`` lowering is layout-safe.

    Args:
        remove_view_copy: as in ``ExecutorchBackendConfig``: turn ``view_copy`` into
            ``memory.view`` where possible, but only where the view is a pure
            reinterpretation of its base's memory (default dim order, dense).
        legalize_for_stock_kernels: convert a non-default-dim-order input of a kept
            ``view_copy`` to the default dim order first, and give every operator's tensors
            dim orders its stock portable kernel accepts (``LegalizeDimOrdersPass``), which
            the stock runtime needs. Pass False for programs that run on etmetal's runtime.
        **kwargs: any other ``ExecutorchBackendConfig`` field. A ``sym_shape_eval_pass``
            given here (one pass or a per-method dict) still runs, after the lowering.
    """
    view_copy_pass = LayoutSafeViewCopyPass(
        replace_views=remove_view_copy, legalize_for_stock_kernels=legalize_for_stock_kernels
    )

    legalize_pass = LegalizeDimOrdersPass() if legalize_for_stock_kernels else None

    def wrap(sym_shape_eval_pass: PassType) -> ViewCopyThenSymShapeEvalPass:
        return ViewCopyThenSymShapeEvalPass(view_copy_pass, sym_shape_eval_pass, legalize_pass)

    sym_shape_eval = kwargs.pop("sym_shape_eval_pass", None)
    if sym_shape_eval is None:
        sym_shape_eval = ExecutorchBackendConfig().sym_shape_eval_pass
    if isinstance(sym_shape_eval, dict):
        wrapped: Any = _PerMethodPasses(sym_shape_eval, wrap)
    elif isinstance(sym_shape_eval, PassBase):
        wrapped = wrap(sym_shape_eval)
    else:
        raise TypeError(
            "backend_config: sym_shape_eval_pass must be a PassBase or a dict of them, "
            f"got {type(sym_shape_eval).__name__}"
        )
    # The stock replacement is unsafe on non-default dim orders; ours replaces it.
    return ExecutorchBackendConfig(remove_view_copy=False, sym_shape_eval_pass=wrapped, **kwargs)
