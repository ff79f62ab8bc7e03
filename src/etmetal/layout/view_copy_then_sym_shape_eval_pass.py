"""The pass ``etmetal.backend_config()`` installs as ``sym_shape_eval_pass``: the one hook
between spec propagation and memory planning (see ``config``), so it runs etmetal's
layout passes there before the symbolic-shape evaluation it stands in for."""

from __future__ import annotations

import torch
from executorch.exir.pass_manager import PassType
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from etmetal.layout.layout_safe_view_copy_pass import LayoutSafeViewCopyPass
from etmetal.layout.legalize_dim_orders_pass import LegalizeDimOrdersPass


class ViewCopyThenSymShapeEvalPass(PassBase):
    """Run the layout-safe ``view_copy`` lowering, then (for the stock kernels) the
    dim-order legalization, then the configured symbolic-shape evaluation pass (upper
    bounds for memory planning)."""

    def __init__(
        self,
        view_copy_pass: LayoutSafeViewCopyPass,
        sym_shape_eval_pass: PassType,
        legalize_pass: LegalizeDimOrdersPass | None = None,
    ) -> None:
        super().__init__()
        self.view_copy_pass = view_copy_pass
        self.legalize_pass = legalize_pass
        self.sym_shape_eval_pass = sym_shape_eval_pass

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        result = self.view_copy_pass(graph_module)
        modified = result.modified
        if self.legalize_pass is not None:
            result = self.legalize_pass(result.graph_module)
            modified = modified or result.modified
        second = self.sym_shape_eval_pass(result.graph_module)
        return PassResult(second.graph_module, modified or bool(second.modified))
