"""The custom (non-ATen) operators the Metal delegate runs, and the C shims they become.

AOTInductor emits a direct call ``aoti_torch_<device>_<op>(...)`` for a custom operator
listed in ``aot_inductor.custom_ops_to_c_shims`` (else it would need libtorch's proxy
executor). Upstream's Metal runtime implements three such shims; the parameter lists
below are theirs (torchao's ``cshim.py``, ExecuTorch's ``metal/ops/*.py``), and etmetal
declares them for the ``cpu`` prefix too so the ``host`` target runs the same operators.

The ahead-of-time side hands :func:`c_shim_declarations` to Inductor; the shims' bridge
reads :func:`declarations` to forward each symbol with its exact C signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from .targets import CPU_DEVICE, METAL_DEVICE


@dataclass(frozen=True)
class CustomOpShim:
    qualname: str  # namespace::name of the operator (default overload)
    params: str  # the C parameter list of its shim

    @property
    def op_name(self) -> str:
        return self.qualname.split("::")[1]

    def symbol(self, device: str) -> str:
        return f"aoti_torch_{device}_{self.op_name}"

    def declaration(self, device: str) -> str:
        return f"AOTITorchError {self.symbol(device)}({self.params})"


CUSTOM_OP_SHIMS: tuple[CustomOpShim, ...] = (
    # torchao's fpa4w linear (UIntxWeightOnlyConfig, bitwidth 4)
    CustomOpShim(
        "torchao::_linear_fp_act_4bit_weight",
        "AtenTensorHandle A, AtenTensorHandle B, int64_t group_size, AtenTensorHandle S, "
        "AtenTensorHandle Z, AtenTensorHandle* ret",
    ),
    # MoE: y[i] = dequant(W[expert_indices[i]]) @ x[i]
    CustomOpShim(
        "metal::gather_qmv",
        "AtenTensorHandle X, AtenTensorHandle W, AtenTensorHandle S, AtenTensorHandle Z, "
        "AtenTensorHandle ExpertIndices, int64_t group_size, AtenTensorHandle* ret",
    ),
    # linear attention recurrence; writes the new state into StateIn
    CustomOpShim(
        "metal::gated_delta_rule",
        "AtenTensorHandle Q, AtenTensorHandle K, AtenTensorHandle V, AtenTensorHandle G, "
        "AtenTensorHandle Beta, AtenTensorHandle StateIn, AtenTensorHandle* retY",
    ),
)

CUSTOM_OP_NAMES: frozenset[str] = frozenset(s.op_name for s in CUSTOM_OP_SHIMS)


def declarations(devices: tuple[str, ...] = (CPU_DEVICE, METAL_DEVICE)) -> list[str]:
    """Every custom shim's C declaration, for each device prefix."""
    return [s.declaration(d) for s in CUSTOM_OP_SHIMS for d in devices]
