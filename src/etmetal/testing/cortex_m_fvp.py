"""What ExecuTorch's Cortex-M FVP test runner can run, as facts the host run reproduces.

Upstream's implementation tests run their ``.pte`` on a Corstone-300 FVP with a
semihosting ``arm_executor_runner`` that ``backends/cortex_m/test/build_test_runner.sh``
builds with a selective kernel build (``--select_ops_list``): the runner links only
the operators in that list, and loading a method that calls any other operator fails
(ExecuTorch's ``OperatorMissing``). Some of upstream's strict xfails are exactly that
(a division that broadcasts, a softmax over a non-last dim: the quantizer leaves them
as float ATen operators the runner does not have). etmetal's runtime has a kernel for
everything, so :func:`check_runner_kernels` refuses such a program the way the runner
does, and those cases fail on the host as upstream expects.

Other xfails are not about the device but about a kernel the FVP runs:
:data:`HOST_DIFFERENCES` names them with their reason; the plugin reports them and
does not count them as failures.

Source of the list: ``build_test_runner.sh`` as of ExecuTorch commit e5f6b69 (2026-08-07,
"Generate runner-specific operator libs"), the latest version available, plus
``aten::sub.out``. The installed 1.5.1 tests have an ``ops/test_sub.py`` that no available
upstream revision has; its ``alpha_float`` case keeps a float ``aten::sub.out`` on purpose
and upstream expects it to pass on the FVP, so the 1.5.1 runner links that kernel. (The
script is not in the wheel.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# the runner's --select_ops_list, operator.overload as the program names them
RUNNER_OPERATORS = frozenset(
    {
        "aten::add.out",
        "aten::clamp.out",
        "aten::mul.out",
        "aten::convolution.out",
        "aten::max_pool2d_with_indices.out",
        "dim_order_ops::_clone_dim_order.out",
        "aten::cat.out",
        "aten::full.out",
        "aten::ge.Tensor_out",
        "aten::unsqueeze_copy.out",
        "aten::select_copy.int_out",
        "aten::amax.out",
        "aten::sub.out",  # not in e5f6b69's list: see the module docstring
        "cortex_m::quantize_per_tensor.out",
        "cortex_m::dequantize_per_tensor.out",
        "cortex_m::quantized_add.out",
        "cortex_m::quantized_div.out",
        "cortex_m::quantized_mul.out",
        "cortex_m::quantized_activation.out",
        "cortex_m::minimum.out",
        "cortex_m::maximum.out",
        "cortex_m::quantized_linear.out",
        "cortex_m::softmax.out",
        "cortex_m::transpose.out",
        "cortex_m::pad.out",
        "cortex_m::quantized_conv2d.out",
        "cortex_m::quantized_depthwise_conv2d.out",
        "cortex_m::quantized_transpose_conv2d.out",
        "cortex_m::quantized_avg_pool2d.out",
        "cortex_m::quantized_max_pool2d.out",
        "cortex_m::quantized_batch_matmul.out",
    }
)


class RunnerKernelMissing(RuntimeError):
    """The program calls an operator the FVP test runner was not built with."""


def operator_names(buffer: bytes) -> list[str]:
    """``name.overload`` of every operator a serialized program's methods call."""
    from etmetal.runtime.loader import load_program_data

    program = load_program_data(bytes(buffer)).program
    names = {
        f"{op.name}.{op.overload}" if op.overload else op.name
        for plan in program.execution_plan
        for op in plan.operators
    }
    return sorted(names)


def check_runner_kernels(operators: Iterable[str]) -> None:
    """Raise :class:`RunnerKernelMissing` naming the operators the runner lacks."""
    missing = sorted(set(operators) - RUNNER_OPERATORS)
    if missing:
        raise RunnerKernelMissing(
            f"the Cortex-M FVP test runner (build_test_runner.sh --select_ops_list) has no "
            f"kernel for {', '.join(missing)}: method load would fail with OperatorMissing "
            f"(run with --etmetal-cortex-m-kernels=all to use every etmetal kernel)"
        )


@dataclass(frozen=True)
class HostDifference:
    """An upstream strict xfail that passes on the host because the host is more capable."""

    file: str  # test file name
    function: str  # test function
    case: str  # the test case id (after the Cortex-M target in the test id)
    reason: str

    def matches(self, file: str, function: str, param_id: str) -> bool:
        return (
            file == self.file
            and function == self.function
            and (param_id == self.case or param_id.endswith("-" + self.case))
        )


HOST_DIFFERENCES = (
    HostDifference(
        "test_conv.py",
        "test_implementation_conv2d",
        "conv3d",
        "a Conv3d stays a float aten::convolution.out (the Cortex-M passes lower 2-D only). "
        "The runner has that operator, but ExecuTorch's portable convolution kernel accepts "
        "only 3-D and 4-D inputs (check_convolution_args; 3-D support was reverted in "
        "#20888); etmetal's kernel is ATen's, which takes 5-D",
    ),
)


def host_difference(nodeid: str) -> HostDifference | None:
    """The named difference for the test ``nodeid`` (``path/test_x.py::test_f[id]``), if any."""
    path, _, name = nodeid.partition("::")
    function, _, param_id = name.partition("[")
    for diff in HOST_DIFFERENCES:
        if diff.matches(path.rsplit("/", 1)[-1], function, param_id.rstrip("]")):
            return diff
    return None
