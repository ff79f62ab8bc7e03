"""etmetal's ``cortex_m::`` kernels against ExecuTorch's own Python reference implementations.

The reference is ``torch.ops.cortex_m.<op>`` as registered by
``executorch/backends/cortex_m/ops/operators.py`` (the model of the CMSIS-NN
kernels the Cortex-M flow tests its lowering with). Every comparison is exact:
int8 outputs must be bit-identical. Quantization parameters are derived from
float scales with the flow's own ``quantize_multiplier_aot``.
"""

from __future__ import annotations

import math
from pathlib import Path

import executorch.backends.cortex_m.passes  # noqa: F401  (registers torch.ops.cortex_m)
import pytest
import torch
from executorch.backends.cortex_m.passes.passes_utils import quantize_multiplier_aot

from etmetal.runtime.kernels import cortex_m  # noqa: F401  (registers the kernels)
from etmetal.runtime.kernels.cortex_m_common import CortexMKernelError
from etmetal.runtime.kernels.registry import lookup

CL = torch.channels_last


def ref(name: str):
    return getattr(torch.ops.cortex_m, name).default


def run(name: str, *args, out: torch.Tensor) -> torch.Tensor:
    lookup(f"cortex_m::{name}.out")(*args, out)
    return out


def empty_like_ref(expected: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """A planned-memory style out tensor: garbage-filled, in the requested dim order."""
    fmt = CL if channels_last and expected.dim() == 4 else torch.contiguous_format
    out = torch.empty(expected.shape, dtype=expected.dtype, memory_format=fmt)
    if out.is_floating_point():
        out.fill_(float("nan"))
    else:
        out.fill_(77)
    return out


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if not torch.equal(actual, expected):
        diff = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
        raise AssertionError(
            f"{int((diff > 0).sum())} of {diff.numel()} elements differ, max {diff.max().item()}"
        )


def rand_int8(*shape, channels_last=False, gen=None) -> torch.Tensor:
    t = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
    return t.to(memory_format=CL) if channels_last and len(shape) == 4 else t


def mult_shift(scale: float) -> tuple[int, int]:
    return quantize_multiplier_aot(scale)


def per_channel(scales: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [mult_shift(s) for s in scales]
    return (
        torch.tensor([m for m, _ in pairs], dtype=torch.int32),
        torch.tensor([s for _, s in pairs], dtype=torch.int32),
    )


def test_every_operator_in_operators_yaml_has_a_kernel():
    import yaml
    from executorch.backends.cortex_m.ops import operators

    entries = yaml.safe_load((Path(operators.__file__).parent / "operators.yaml").read_text())
    names = [e["func"].split("(")[0] for e in entries]
    assert len(names) >= 20
    for name in names:
        assert callable(lookup(name)), name


# ---------------------------------------------------------------- quantize / dequantize


@pytest.mark.parametrize("shape", [(7,), (2, 3, 5, 4), (1, 8, 6, 6)])
@pytest.mark.parametrize("scale,zp", [(0.02, 0), (0.0078125, -5), (0.37, 100)])
@pytest.mark.parametrize("dtype_arg", [torch.int8, 1])  # torch dtype or ExecuTorch code
def test_quantize_dequantize(shape, scale, zp, dtype_arg):
    x = torch.randn(shape) * 3
    if len(shape) == 4:
        x = x.to(memory_format=CL)
    q_ref = ref("quantize_per_tensor")(x, scale, zp, -128, 127, torch.int8)
    q = run("quantize_per_tensor", x, scale, zp, -128, 127, dtype_arg, out=empty_like_ref(q_ref))
    assert_same(q, q_ref)
    d_ref = ref("dequantize_per_tensor")(q_ref, scale, zp, -128, 127, torch.int8)
    d = run("dequantize_per_tensor", q_ref, scale, zp, -128, 127, dtype_arg,
            out=empty_like_ref(d_ref, channels_last=True))  # fmt: skip
    assert_same(d, d_ref)


# ---------------------------------------------------------------- elementwise


def _add_params(s1: float, s2: float, so: float):
    # the lowering's construction: both inputs rescaled to twice the larger scale
    max2 = 2 * max(s1, s2)
    m1, sh1 = mult_shift(s1 / max2)
    m2, sh2 = mult_shift(s2 / max2)
    mo, sho = mult_shift(max2 / (so * (1 << 20)))
    return m1, sh1, m2, sh2, mo, sho


ADD_SHAPES = [
    ((2, 3, 4, 5), (2, 3, 4, 5)),
    ((1, 8, 5, 5), (1, 8, 1, 1)),  # per-channel operand
    ((1, 8, 1, 1), (1, 8, 5, 5)),
    ((33,), (33,)),
]


@pytest.mark.parametrize("shapes", ADD_SHAPES)
@pytest.mark.parametrize(
    "scales,zps,act",
    [
        ((0.05, 0.05, 0.1), (0, 0, 0), (-128, 127)),
        ((0.02, 0.11, 0.07), (-3, 20, -128), (-128, 127)),
        ((0.3, 0.01, 0.25), (7, -7, 2), (2, 90)),  # fused relu-like range
    ],
)
def test_quantized_add(shapes, scales, zps, act):
    a = rand_int8(*shapes[0], channels_last=True)
    b = rand_int8(*shapes[1], channels_last=True)
    m1, sh1, m2, sh2, mo, sho = _add_params(*scales)
    args = (a, zps[0], m1, sh1, b, zps[1], m2, sh2, zps[2], mo, sho, *act)
    expected = ref("quantized_add")(*args)
    for cl in (True, False):
        assert_same(run("quantized_add", *args, out=empty_like_ref(expected, cl)), expected)


@pytest.mark.parametrize("shapes", ADD_SHAPES)
@pytest.mark.parametrize(
    "scales,zps", [((0.05, 0.05, 0.1), (0, 0, 0)), ((0.02, 0.3, 0.04), (9, -100, 5))]
)
def test_quantized_mul(shapes, scales, zps):
    a = rand_int8(*shapes[0], channels_last=True)
    b = rand_int8(*shapes[1], channels_last=True)
    mo, sho = mult_shift(scales[0] * scales[1] / scales[2])
    args = (a, zps[0], b, zps[1], zps[2], mo, sho)
    expected = ref("quantized_mul")(*args)
    assert_same(run("quantized_mul", *args, out=empty_like_ref(expected)), expected)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
@pytest.mark.parametrize("zps,out_scale", [((0, 0, 0), 0.5), ((3, -4, 10), 7.25)])
def test_quantized_div(dtype, zps, out_scale):
    info = torch.iinfo(dtype)
    a = torch.randint(info.min, info.max + 1, (4, 9), dtype=dtype)
    b = torch.randint(info.min, info.max + 1, (4, 9), dtype=dtype)
    b[0, :3] = zps[1]  # divisions by (quantized) zero
    args = (a, zps[0], b, zps[1], zps[2], out_scale)
    expected = ref("quantized_div")(*args)
    assert_same(run("quantized_div", *args, out=empty_like_ref(expected)), expected)


@pytest.mark.parametrize("shape", [(300,), (2, 4, 3, 3)])
def test_quantized_activation_lut(shape):
    x = rand_int8(*shape, channels_last=True)
    lut = rand_int8(256)
    expected = ref("quantized_activation")(x, lut)
    assert_same(run("quantized_activation", x, lut, out=empty_like_ref(expected, True)), expected)


@pytest.mark.parametrize("name", ["minimum", "maximum"])
@pytest.mark.parametrize("other_shape", [(2, 3, 4, 4), (1,), (1, 3, 1, 1)])
def test_minimum_maximum(name, other_shape):
    a = rand_int8(2, 3, 4, 4, channels_last=True)
    b = rand_int8(*other_shape)
    expected = ref(name)(a, b)
    assert_same(run(name, a, b, out=empty_like_ref(expected, True)), expected)


# ---------------------------------------------------------------- matrix products


@pytest.mark.parametrize("in_shape,out_features", [((1, 16), 8), ((3, 5, 40), 12), ((2, 640), 128)])
@pytest.mark.parametrize("path", ["bias", "kernel_sum", "no_bias"])
@pytest.mark.parametrize("act", [(-128, 127), (-20, 127)])
def test_quantized_linear(in_shape, out_features, path, act):
    x = rand_int8(*in_shape)
    w = rand_int8(out_features, in_shape[-1])
    input_offset, filter_offset, output_offset = 7, 0, -12
    bias = torch.randint(-5000, 5000, (out_features,), dtype=torch.int32)
    kernel_sum = None
    if path == "kernel_sum":
        kernel_sum = (w.to(torch.int32).sum(1) * input_offset + bias).to(torch.int32)
        bias = None
    elif path == "no_bias":
        bias = None
    m, s = mult_shift(0.0007)
    args = (
        x,
        w,
        bias,
        kernel_sum,
        input_offset,
        filter_offset,
        output_offset,
        [m],
        [s],
        act[1],
        act[0],
    )
    expected = ref("quantized_linear")(*args)
    assert_same(run("quantized_linear", *args, out=empty_like_ref(expected)), expected)


@pytest.mark.parametrize("shape", [(1, 4, 8, 5), (3, 7, 16, 2)])
@pytest.mark.parametrize("zps", [(0, 0, 0), (12, -3, -7)])
def test_quantized_batch_matmul(shape, zps):
    batch, rows, inner, cols = shape
    lhs, rhs_t = rand_int8(batch, rows, inner), rand_int8(batch, cols, inner)
    m, s = mult_shift(0.0011)
    args = (lhs, zps[0], rhs_t, zps[1], zps[2], m, s, torch.empty(0, dtype=torch.int8))
    expected = ref("quantized_batch_matmul")(*args)
    assert_same(run("quantized_batch_matmul", *args, out=empty_like_ref(expected)), expected)


# ---------------------------------------------------------------- softmax and layout


@pytest.mark.parametrize("shape,dim", [((1, 10), -1), ((2, 3, 7), 1), ((4, 6), 0)])
@pytest.mark.parametrize("in_scale,in_zp", [(0.05, 0), (0.2, -20), (0.01, 60)])
def test_softmax(shape, dim, in_scale, in_zp):
    x = rand_int8(*shape)
    real = min(in_scale * (1 << 26), float((1 << 31) - 1))
    m, s = mult_shift(real)
    diff_min = -int(math.floor(31 * math.ldexp(1.0, 26) / math.ldexp(1.0, s)))
    args = (x, dim, in_zp, -128, m, s, diff_min)
    expected = ref("softmax")(*args)
    assert_same(run("softmax", *args, out=empty_like_ref(expected)), expected)


@pytest.mark.parametrize(
    "shape,perm", [((2, 3, 4, 5), [0, 2, 3, 1]), ((5, 7), [1, 0]), ((2, 3, 4), [2, 0, 1])]
)
def test_transpose(shape, perm):
    x = rand_int8(*shape)
    expected = ref("transpose")(x, perm)
    assert_same(run("transpose", x, perm, out=empty_like_ref(expected)), expected)


@pytest.mark.parametrize(
    "shape,channels_last",
    [
        ((1, 3, 6, 5), True),
        ((1, 3, 6, 5), False),
        ((1, 1, 49, 10), True),
        ((4, 6, 5), False),
        ((9, 4), False),
    ],
)
@pytest.mark.parametrize("pads", [([0, 1, 2, 0], [0, 0, 1, 3]), ([0, 0, 1, 1], [0, 2, 1, 1])])
def test_pad(shape, channels_last, pads):
    x = rand_int8(*shape, channels_last=channels_last)
    expected = ref("pad")(x, pads[0], pads[1], -9)
    out = empty_like_ref(expected, channels_last)
    assert_same(run("pad", x, pads[0], pads[1], -9, out=out), expected)


# ---------------------------------------------------------------- convolution and pooling


def dilate_ohwi(w: torch.Tensor, dilation: tuple[int, int]) -> torch.Tensor:
    o, kh, kw, i = w.shape
    dh, dw = dilation
    out = torch.zeros(o, (kh - 1) * dh + 1, (kw - 1) * dw + 1, i, dtype=w.dtype)
    out[:, ::dh, ::dw, :] = w
    return out


CONV_CASES = [
    # in_shape (NCHW), out_channels, kernel, stride, padding, dilation, groups
    ((1, 3, 9, 9), 8, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 10, 7), 6, (3, 2), (2, 1), (0, 1), (1, 1), 1),
    ((1, 8, 12, 12), 4, (3, 3), (1, 2), (2, 2), (2, 2), 1),
    ((1, 6, 8, 8), 6, (1, 1), (1, 1), (0, 0), (1, 1), 2),  # grouped
    ((1, 1, 49, 10), 16, (10, 4), (2, 2), (5, 1), (1, 1), 1),  # ds_cnn's first layer
]


def _conv_params(out_channels: int, with_bias: bool):
    mults, shifts = per_channel([0.0003 * (1 + 0.37 * i) for i in range(out_channels)])
    bias = torch.randint(-20000, 20000, (out_channels,), dtype=torch.int32) if with_bias else None
    return mults, shifts, bias


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("act", [(-128, 127), (-128 + 30, 127)])
def test_quantized_conv2d(case, with_bias, act):
    in_shape, out_c, kernel, stride, padding, dilation, groups = case
    x = rand_int8(*in_shape, channels_last=True)
    w = rand_int8(out_c, *kernel, in_shape[1] // groups)  # OHWI
    mults, shifts, bias = _conv_params(out_c, with_bias)
    scratch = torch.empty(0, dtype=torch.int8)
    args = (
        x,
        w,
        bias,
        list(stride),
        list(padding),
        list(dilation),
        11,
        -4,
        mults,
        shifts,
        *act,
        scratch,
    )
    if dilation == (1, 1):
        expected = ref("quantized_conv2d")(*args)
    else:
        # aten has no dilated integer convolution, so neither has the reference: give it
        # the equivalent undilated kernel with zeros between the taps instead
        expected = ref("quantized_conv2d")(
            x, dilate_ohwi(w, dilation), *args[2:5], [1, 1], *args[6:]
        )
    for cl in (True, False):
        assert_same(run("quantized_conv2d", *args, out=empty_like_ref(expected, cl)), expected)
    # explicit-layout variant: NHWC tensors
    nhwc_args = (x.permute(0, 2, 3, 1).contiguous(), *args[1:])
    assert_same(
        run("quantized_conv2d_nhwc", *nhwc_args, out=empty_like_ref(expected.permute(0, 2, 3, 1))),
        expected.permute(0, 2, 3, 1),
    )
    if dilation != (1, 1):
        return
    expected = ref("quantized_conv2d_nhwc")(*nhwc_args)
    assert_same(run("quantized_conv2d_nhwc", *nhwc_args, out=empty_like_ref(expected)), expected)


@pytest.mark.parametrize(
    "in_shape,depth_multiplier,kernel,stride,padding",
    [
        ((1, 8, 10, 10), 1, (3, 3), (1, 1), (1, 1)),
        ((1, 4, 9, 6), 2, (3, 3), (2, 2), (1, 1)),
        ((2, 16, 7, 7), 1, (5, 3), (1, 2), (2, 0)),
        ((1, 3, 5, 5), 3, (5, 5), (1, 1), (2, 2)),
        ((1, 64, 25, 5), 1, (3, 3), (1, 1), (1, 1)),  # ds_cnn's depthwise layers
    ],
)
@pytest.mark.parametrize("with_bias", [True, False])
def test_quantized_depthwise_conv2d(in_shape, depth_multiplier, kernel, stride, padding, with_bias):
    x = rand_int8(*in_shape, channels_last=True)
    out_c = in_shape[1] * depth_multiplier
    w = rand_int8(1, *kernel, out_c)  # IHWO
    mults, shifts, bias = _conv_params(out_c, with_bias)
    scratch = torch.empty(0, dtype=torch.int8)
    args = (x, w, bias, list(stride), list(padding), [1, 1], depth_multiplier, 128, 3,
            mults, shifts, -128, 127, scratch)  # fmt: skip
    for name, a in (
        ("quantized_depthwise_conv2d", args),
        ("quantized_depthwise_conv2d_nhwc", (x.permute(0, 2, 3, 1).contiguous(), *args[1:])),
    ):
        expected = ref(name)(*a)
        assert_same(run(name, *a, out=empty_like_ref(expected, True)), expected)


@pytest.mark.parametrize(
    "in_shape,out_c,kernel,stride,padding,output_padding",
    [
        ((1, 4, 4, 4), 2, (3, 3), (2, 2), (1, 1), (0, 0)),
        ((1, 3, 5, 3), 5, (2, 3), (1, 2), (0, 1), (0, 1)),
        ((2, 6, 3, 3), 4, (4, 4), (2, 2), (1, 1), (1, 1)),
    ],
)
@pytest.mark.parametrize("with_bias", [True, False])
def test_quantized_transpose_conv2d(
    in_shape, out_c, kernel, stride, padding, output_padding, with_bias
):
    x = rand_int8(*in_shape, channels_last=True)
    w = rand_int8(out_c, *kernel, in_shape[1])  # OHWI
    mults, shifts, bias = _conv_params(out_c, with_bias)
    scratch = torch.empty(0, dtype=torch.int8)
    args = (x, w, bias, list(stride), list(padding), list(output_padding), [1, 1], -2, 9,
            mults, shifts, -128, 127, scratch, scratch)  # fmt: skip
    for name, a in (
        ("quantized_transpose_conv2d", args),
        ("quantized_transpose_conv2d_nhwc", (x.permute(0, 2, 3, 1).contiguous(), *args[1:])),
    ):
        expected = ref(name)(*a)
        assert_same(run(name, *a, out=empty_like_ref(expected, True)), expected)


POOL_CASES = [
    # in_shape, kernel, stride, padding, ceil_mode
    ((1, 4, 8, 8), [3, 3], [2, 2], [1, 1], False),
    ((1, 64, 25, 5), [25, 5], [25, 5], [0, 0], False),  # ds_cnn's global pool
    ((2, 3, 7, 9), [2, 3], [2, 2], [0, 1], True),
    ((1, 16, 4, 4), [4], [4], [0], False),
]


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("zp,scale", [(0, 0.05), (-17, 0.013), (40, 0.5)])
def test_quantized_avg_pool2d(case, zp, scale):
    in_shape, kernel, stride, padding, ceil_mode = case
    x = rand_int8(*in_shape, channels_last=True)
    m, s = mult_shift(scale)
    scratch = torch.empty(0, dtype=torch.int8)
    args = (x, kernel, stride, padding, ceil_mode, zp, m, s, scratch)
    for name, a in (
        ("quantized_avg_pool2d", args),
        ("quantized_avg_pool2d_nhwc", (x.permute(0, 2, 3, 1).contiguous(), *args[1:])),
    ):
        expected = ref(name)(*a)
        assert_same(run(name, *a, out=empty_like_ref(expected, True)), expected)


@pytest.mark.parametrize("case", [c for c in POOL_CASES if not c[4]])
@pytest.mark.parametrize("act", [(-128, 127), (-5, 100)])
def test_quantized_max_pool2d(case, act):
    in_shape, kernel, stride, padding, _ = case
    x = rand_int8(*in_shape, channels_last=True)
    args = (x, kernel, stride, padding, [1, 1], False, 3, 3, *act)
    for name, a in (
        ("quantized_max_pool2d", args),
        ("quantized_max_pool2d_nhwc", (x.permute(0, 2, 3, 1).contiguous(), *args[1:])),
    ):
        expected = ref(name)(*a)
        assert_same(run(name, *a, out=empty_like_ref(expected, True)), expected)


# ---------------------------------------------------------------- bad input


def test_bad_arguments_raise_errors_naming_operator_and_argument():
    x = rand_int8(1, 4, 4, 4, channels_last=True)
    out = torch.empty_like(x)
    with pytest.raises(CortexMKernelError, match=r"quantized_activation\.out.*256"):
        run("quantized_activation", x, rand_int8(255), out=out)
    with pytest.raises(CortexMKernelError, match=r"quantized_add\.out.*'self'.*float32"):
        run(
            "quantized_add",
            x.float(),
            0,
            1 << 30,
            -1,
            x,
            0,
            1 << 30,
            -1,
            0,
            1 << 30,
            0,
            -128,
            127,
            out=out,
        )
    with pytest.raises(CortexMKernelError, match=r"quantized_add\.out.*\[1, 4, 4, 4\].*\[1, 3\]"):
        run(
            "quantized_add",
            x,
            0,
            1 << 30,
            -1,
            rand_int8(1, 3),
            0,
            1 << 30,
            -1,
            0,
            1 << 30,
            0,
            -128,
            127,
            out=out,
        )
    with pytest.raises(CortexMKernelError, match=r"dequantize_per_tensor\.out.*out.*float32"):
        run(
            "dequantize_per_tensor",
            x,
            0.1,
            0,
            -128,
            127,
            torch.int8,
            out=torch.empty(x.shape, dtype=torch.int32),
        )
    with pytest.raises(CortexMKernelError, match=r"quantize_per_tensor\.out.*ScalarType 99"):
        run("quantize_per_tensor", x.float(), 0.1, 0, -128, 127, 99, out=out)
    mults, shifts = per_channel([0.001] * 3)  # 3 parameters, 8 output channels
    w = rand_int8(8, 3, 3, 4)
    with pytest.raises(
        CortexMKernelError, match=r"quantized_conv2d\.out.*3 requantization parameters for 8"
    ):
        run("quantized_conv2d", x, w, None, [1, 1], [1, 1], [1, 1], 0, 0, mults, shifts, -128, 127,
            torch.empty(0), out=torch.empty(1, 8, 4, 4, dtype=torch.int8))  # fmt: skip
    with pytest.raises(CortexMKernelError, match=r"quantized_conv2d\.out.*weight.*does not fit"):
        run("quantized_conv2d", x, rand_int8(8, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], 0, 0, mults,
            shifts, -128, 127, torch.empty(0), out=torch.empty(1, 8, 4, 4, dtype=torch.int8))  # fmt: skip
    with pytest.raises(CortexMKernelError, match=r"quantized_max_pool2d\.out.*zero points differ"):
        run(
            "quantized_max_pool2d",
            x,
            [2, 2],
            [2, 2],
            [0, 0],
            [1, 1],
            False,
            1,
            2,
            -128,
            127,
            out=out,
        )
    with pytest.raises(CortexMKernelError, match=r"quantized_linear\.out.*does not match weights"):
        run("quantized_linear", rand_int8(2, 5), rand_int8(3, 6), None, None, 0, 0, 0, [1 << 30], [0],
            127, -128, out=torch.empty(2, 3, dtype=torch.int8))  # fmt: skip


# ---------------------------------------------------------------- whole zoo programs

# lowered programs that together use conv, depthwise and transposed conv, pad, average
# pooling, linear, mul, minimum and transpose (the end-to-end runtime test covers more)
ZOO_REPLAY = ["ds_cnn", "hardswish", "conv_transpose2d", "transpose_linear"]


class _EtmetalKernelInterpreter(torch.fx.Interpreter):
    """Evaluates a Cortex-M dialect graph, sending every ``cortex_m`` node to etmetal's
    kernel with an out tensor laid out as the node's recorded result."""

    def __init__(self, module):
        super().__init__(module)
        self.calls: dict[str, int] = {}

    def run_node(self, n):
        self._node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        name = getattr(target, "_name", "") or str(target)
        if not name.startswith("cortex_m::"):
            return super().call_function(target, args, kwargs)
        val = self._node.meta["val"]
        out = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype)
        lookup(f"{name}.out")(*args, *kwargs.values(), out)
        self.calls[name] = self.calls.get(name, 0) + 1
        return out


@pytest.mark.parametrize("case_name", ZOO_REPLAY)
def test_zoo_dialect_program_on_etmetal_kernels_is_bit_exact(case_name):
    """Every cortex_m call of a lowered zoo program, with its real quantization parameters,
    run on etmetal's kernels: the program's outputs equal the Python reference's exactly."""
    from executorch.backends.cortex_m.test.tester import CortexMTester
    from executorch.backends.test.harness.stages import StageType

    from etmetal.examples.cortex_m_zoo import zoo

    model, inputs = zoo()[case_name].build()
    tester = CortexMTester(model, inputs)
    tester.quantize(None).export().to_edge().run_passes()
    with torch.no_grad():
        expected = tester.stages[StageType.RUN_PASSES].run_artifact(inputs)
        module = tester.get_artifact(StageType.RUN_PASSES).exported_program().module()
        interpreter = _EtmetalKernelInterpreter(module)
        actual = interpreter.run(*inputs)
    assert interpreter.calls, "the lowered program has no cortex_m operators"
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    actual = [actual] if isinstance(actual, torch.Tensor) else list(actual)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_same(a, e)


@pytest.mark.parametrize("dilation,depth_multiplier", [((2, 2), 1), ((1, 3), 2)])
def test_quantized_depthwise_conv2d_dilated(dilation, depth_multiplier):
    # the reference cannot run a dilated integer convolution: give it the equivalent
    # undilated kernel with zeros between the taps
    x = rand_int8(1, 6, 11, 12, channels_last=True)
    out_c = 6 * depth_multiplier
    w = rand_int8(1, 3, 3, out_c)
    mults, shifts, bias = _conv_params(out_c, True)
    tail = (depth_multiplier, -1, 5, mults, shifts, -128, 127, torch.empty(0, dtype=torch.int8))
    expected = ref("quantized_depthwise_conv2d")(
        x, dilate_ohwi(w, dilation), bias, [1, 1], [2, 2], [1, 1], *tail
    )
    actual = run("quantized_depthwise_conv2d", x, w, bias, [1, 1], [2, 2], list(dilation), *tail,
                 out=empty_like_ref(expected, True))  # fmt: skip
    assert_same(actual, expected)
