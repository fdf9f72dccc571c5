"""Kernel conformance: each op of ops_yaml against torch eager, on randomized shapes and dtypes
(size-1 and broadcast dims, odd sizes, groups), through programs built by etbuild's pipeline."""

from __future__ import annotations

import random

import pytest
import torch
from rt_helpers import assert_matches
from torch import nn


class Fn(nn.Module):
    """Wraps a function of the inputs (and optional constant tensors) as a module."""

    def __init__(self, fn, **consts: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for k, v in consts.items():
            self.register_buffer(k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _run_case(rt, pipeline_program, module, inputs, rel=1e-4):
    module.eval()
    with torch.no_grad():
        want = module(*inputs)
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    prog = rt.load(str(pipeline_program(module, inputs)))
    got = prog.run(list(inputs))
    assert len(got) == len(wants)
    for g, w in zip(got, wants, strict=True):
        assert_matches(g, w, rel)


def _rand(shape, dtype=torch.float32, gen=None):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    return torch.randint(-50, 50, shape, generator=gen, dtype=dtype)


def _broadcast_pair(rng: random.Random):
    nd = rng.randint(1, 4)
    a = [rng.choice([1, 2, 3, 5, 7]) for _ in range(nd)]
    b = [s if rng.random() < 0.6 else 1 for s in a]
    if rng.random() < 0.3:
        b = b[rng.randint(0, nd - 1) :]  # fewer dims
    if rng.random() < 0.5:
        a, b = b, a
    return a, b


BINARY = {
    "add": lambda m, x, y: x + y,
    "add_alpha": lambda m, x, y: torch.add(x, y, alpha=2),
    "sub": lambda m, x, y: x - y,
    "mul": lambda m, x, y: x * y,
    "div": lambda m, x, y: x / y,
    "maximum": lambda m, x, y: torch.maximum(x, y),
    "minimum": lambda m, x, y: torch.minimum(x, y),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(rt, pipeline_program, op, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    a, b = _broadcast_pair(rng)
    x, y = _rand(a, gen=gen), _rand(b, gen=gen)
    if op == "div":
        y = y.abs() + 0.5
    _run_case(rt, pipeline_program, Fn(BINARY[op]), [x, y])


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.int64, torch.int64),
        (torch.int32, torch.int32),
        (torch.float32, torch.int64),
        (torch.int64, torch.float32),
        (torch.int32, torch.int64),
    ],
)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum"])
def test_binary_dtypes(rt, pipeline_program, op, dtypes):
    gen = torch.Generator().manual_seed(1)
    x = _rand([3, 5], dtypes[0], gen)
    y = _rand([1, 5], dtypes[1], gen)
    _run_case(rt, pipeline_program, Fn(BINARY[op]), [x, y])


def test_maximum_and_minimum_propagate_nan(rt, pipeline_program):
    x = torch.tensor([[1.0, float("nan"), -2.0, 3.0]])
    y = torch.tensor([[float("nan"), 0.5, -1.0, 4.0]])
    module = Fn(lambda m, a, b: (torch.maximum(a, b), torch.minimum(a, b)))
    prog = rt.load(str(pipeline_program(module, [x, y])))
    got = prog.run([x, y])
    for g, w in zip(got, module(x, y), strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_mul_bool(rt, pipeline_program):
    gen = torch.Generator().manual_seed(2)
    x, y = _rand([4, 3], torch.bool, gen), _rand([4, 1], torch.bool, gen)
    _run_case(rt, pipeline_program, Fn(BINARY["mul"]), [x, y])


def test_binary_with_constant(rt, pipeline_program):
    c = torch.randn(1, 6)
    _run_case(rt, pipeline_program, Fn(lambda m, x: x * m.c + m.c, c=c), [torch.randn(3, 6)])


UNARY = {
    "relu": lambda m, x: torch.relu(x),
    "relu6": lambda m, x: nn.functional.relu6(x),
    "hardtanh": lambda m, x: nn.functional.hardtanh(x, -0.5, 0.75),
    "gelu": lambda m, x: nn.functional.gelu(x),
    "gelu_tanh": lambda m, x: nn.functional.gelu(x, approximate="tanh"),
    "hardswish": lambda m, x: nn.functional.hardswish(x),
    "hardsigmoid": lambda m, x: nn.functional.hardsigmoid(x),
    "sigmoid": lambda m, x: torch.sigmoid(x),
    "tanh": lambda m, x: torch.tanh(x),
    "clamp": lambda m, x: torch.clamp(x, -0.3, 0.4),
    "clamp_min": lambda m, x: torch.clamp(x, min=-0.1),
    "softmax_last": lambda m, x: torch.softmax(x, -1),
    "softmax_0": lambda m, x: torch.softmax(x, 0),
    "mean_last": lambda m, x: x.mean(-1),
    "mean_keep": lambda m, x: x.mean((0, 2), keepdim=True),
    "sum_last": lambda m, x: x.sum(-1),
    "sum_keep": lambda m, x: x.sum((0, 2), keepdim=True),
    "sum_all": lambda m, x: x.sum(),
    "max_all": lambda m, x: x.max(),
    "min_all": lambda m, x: torch.min(x),
    "exp": lambda m, x: torch.exp(x / 3),
    "log": lambda m, x: torch.log(x.abs() + 0.1),
    "sqrt": lambda m, x: torch.sqrt(x.abs()),
    "rsqrt": lambda m, x: torch.rsqrt(x.abs() + 0.1),
    "abs": lambda m, x: x.abs(),
    "neg": lambda m, x: -x,
    "silu": lambda m, x: nn.functional.silu(x),  # sigmoid times x after decomposition
    "pow2": lambda m, x: x**2,
    "pow3": lambda m, x: torch.pow(x, 3),
    "pow_half": lambda m, x: (x.abs() + 0.1) ** 0.5,
    "pow_inverse": lambda m, x: (x.abs() + 0.5) ** -1,
    "pow_general": lambda m, x: (x.abs() + 0.1) ** 1.7,
    "amax_last": lambda m, x: x.amax(-1),
    "amax_keep": lambda m, x: x.amax((0, 2), keepdim=True),
    "amax_all": lambda m, x: torch.amax(x, dim=()),
    "amin_middle": lambda m, x: x.amin(1),
    "amin_outer_keep": lambda m, x: x.amin((0, 1), keepdim=True),
    "sin": lambda m, x: torch.sin(x),
    "cos": lambda m, x: torch.cos(x),
    "erf": lambda m, x: torch.erf(x / 2),
    "reciprocal": lambda m, x: torch.reciprocal(x.abs() + 0.5),
    "floor": lambda m, x: torch.floor(x),
    "ceil": lambda m, x: torch.ceil(x),
    "round": lambda m, x: torch.round(x * 2) / 2 + torch.round(x),  # x*2 has halves
    "sign": lambda m, x: torch.sign(x),
    "expm1": lambda m, x: torch.expm1(x / 3),
    "log1p": lambda m, x: torch.log1p(x.abs()),
    "leaky_relu": lambda m, x: nn.functional.leaky_relu(x, 0.1),
    "elu": lambda m, x: nn.functional.elu(x, 0.7),
    "selu": lambda m, x: torch.selu(x),  # elu with scale and alpha
    "softplus": lambda m, x: nn.functional.softplus(x),  # exp, log1p, where after decomposition
    "mish": lambda m, x: nn.functional.mish(x),
    "logsigmoid": lambda m, x: nn.functional.logsigmoid(x),  # minimum, exp, log1p
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(rt, pipeline_program, op):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 5, generator=gen) * 3
    _run_case(rt, pipeline_program, Fn(UNARY[op]), [x])


@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_amin_propagate_nan(rt, pipeline_program, op):
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(4))
    x[1, 0] = float("nan")  # a NaN first in its row
    x[2, 4] = float("nan")  # and one later in its row
    fn = Fn(lambda m, x: getattr(torch, op)(x, 1))
    got = rt.load(str(pipeline_program(fn, [x]))).run([x])[0]
    want = getattr(torch, op)(x, 1)
    assert torch.equal(got.isnan(), want.isnan()) and want.isnan().sum() == 2
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(scale_factor=2),  # exact doubling
        dict(scale_factor=3),
        dict(scale_factor=(1.5, 2.5)),
        dict(size=(7, 11)),
        dict(size=(3, 4)),  # smaller than the input
        dict(size=(5, 6)),  # the same size
    ],
)
def test_interpolate_nearest(rt, pipeline_program, kwargs):
    x = torch.randn(2, 3, 5, 6, generator=torch.Generator().manual_seed(6))
    fn = Fn(lambda m, x: nn.functional.interpolate(x, mode="nearest", **kwargs) * 2 - 1)
    _run_case(rt, pipeline_program, fn, [x])


def test_layer_norm(rt, pipeline_program):
    m = nn.LayerNorm(9)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-1, 1)
    _run_case(rt, pipeline_program, m, [torch.randn(2, 3, 9) * 2 + 1])


def _conv_case(seed: int):
    rng = random.Random(seed)
    groups = rng.choice([1, 1, 2, 3])
    cin = groups * rng.choice([1, 2, 3])
    cout = groups * rng.choice([1, 2, 4])
    k = rng.choice([1, 2, 3, 5])
    stride = rng.choice([1, 2, 3])
    pad = rng.choice([0, 1, 2]) if k > 1 else rng.choice([0, 1])
    dil = rng.choice([1, 1, 2])
    h = rng.randint(k * dil, 13)
    w = rng.randint(k * dil, 11)
    n = rng.choice([1, 2])
    bias = rng.random() < 0.5
    return nn.Conv2d(cin, cout, k, stride, pad, dil, groups, bias=bias), torch.randn(n, cin, h, w)


@pytest.mark.parametrize("seed", range(12))
def test_conv2d_random(rt, pipeline_program, seed):
    torch.manual_seed(seed)
    conv, x = _conv_case(seed)
    _run_case(rt, pipeline_program, conv, [x])


@pytest.mark.parametrize(
    "cin,mult,stride,k", [(8, 1, 1, 3), (8, 1, 2, 3), (6, 2, 1, 3), (5, 1, 2, 5), (16, 1, 1, 1)]
)
def test_conv2d_depthwise(rt, pipeline_program, cin, mult, stride, k):
    torch.manual_seed(cin + stride)
    conv = nn.Conv2d(cin, cin * mult, k, stride, k // 2, groups=cin, bias=True)
    _run_case(rt, pipeline_program, conv, [torch.randn(1, cin, 15, 12)])


def test_conv2d_pointwise_large(rt, pipeline_program):
    torch.manual_seed(5)
    conv = nn.Conv2d(37, 70, 1)
    _run_case(rt, pipeline_program, conv, [torch.randn(1, 37, 19, 17)])


def test_conv2d_im2col_large(rt, pipeline_program):
    torch.manual_seed(6)
    conv = nn.Conv2d(64, 33, 3, 1, 1)
    _run_case(rt, pipeline_program, conv, [torch.randn(1, 64, 30, 29)])


@pytest.mark.parametrize("seed", range(6))
def test_conv_transpose2d(rt, pipeline_program, seed):
    """nn.ConvTranspose2d with random stride, padding, dilation, output padding and groups;
    a ReLU after it is fused into the call's clamp."""
    rng = random.Random(seed)
    groups = rng.choice([1, 1, 2])
    cin, cout = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
    stride, dilation = rng.randint(1, 3), rng.randint(1, 2)
    conv = nn.ConvTranspose2d(
        cin, cout, (rng.randint(1, 4), rng.randint(1, 3)), stride=stride,
        padding=rng.randint(0, 1), output_padding=rng.randint(0, max(stride, dilation) - 1),
        groups=groups, dilation=dilation, bias=rng.random() < 0.7,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rng.randint(1, 2), cin, rng.randint(2, 7), rng.randint(2, 7), generator=gen)
    module = nn.Sequential(conv, nn.ReLU()) if seed % 2 else conv
    _run_case(rt, pipeline_program, module, [x])


def test_conv_transpose1d(rt, pipeline_program):
    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(4, 6, 4, stride=2, padding=1, groups=2)
    _run_case(rt, pipeline_program, conv, [torch.randn(1, 4, 9)])


def test_conv1d(rt, pipeline_program):
    torch.manual_seed(7)
    conv = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2)
    _run_case(rt, pipeline_program, conv, [torch.randn(2, 4, 17)])


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 7), (4, 32, 32), (13, 67, 45), (33, 300, 65)])
def test_linear_addmm(rt, pipeline_program, m, k, n):
    torch.manual_seed(m + k + n)
    _run_case(rt, pipeline_program, nn.Linear(k, n), [torch.randn(m, k)])


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 33, 9), (17, 64, 40)])
def test_mm(rt, pipeline_program, m, k, n):
    torch.manual_seed(1)
    _run_case(
        rt, pipeline_program, Fn(lambda mod, a, b: a @ b), [torch.randn(m, k), torch.randn(k, n)]
    )


@pytest.mark.parametrize("b,m,k,n", [(1, 2, 3, 4), (3, 7, 16, 33)])
def test_bmm(rt, pipeline_program, b, m, k, n):
    torch.manual_seed(2)
    _run_case(
        rt,
        pipeline_program,
        Fn(lambda mod, x, y: torch.bmm(x, y)),
        [torch.randn(b, m, k), torch.randn(b, k, n)],
    )


POOL = {
    "maxpool_3s2": nn.MaxPool2d(3, 2, 1),
    "maxpool_ceil": nn.MaxPool2d(2, 2, ceil_mode=True),
    "maxpool_dil": nn.MaxPool2d(3, 1, 1, dilation=2),
    "avgpool_2": nn.AvgPool2d(2),
    "avgpool_pad": nn.AvgPool2d(3, 2, 1),
    "avgpool_nopad": nn.AvgPool2d(3, 2, 1, count_include_pad=False),
    "avgpool_ceil": nn.AvgPool2d(3, 2, 0, ceil_mode=True),
    "adaptive_1": nn.AdaptiveAvgPool2d(1),
    "adaptive_3x2": nn.AdaptiveAvgPool2d((3, 2)),
}


@pytest.mark.parametrize("name", sorted(POOL))
def test_pooling(rt, pipeline_program, name):
    torch.manual_seed(4)
    _run_case(rt, pipeline_program, POOL[name], [torch.randn(2, 3, 11, 9)])


SHAPE_OPS = {
    "view": lambda m, x: x.reshape(x.shape[0], -1) * 2,
    "permute": lambda m, x: x.permute(2, 0, 1) + 1,
    "transpose": lambda m, x: x.transpose(0, 1) * 1,
    "expand": lambda m, x: x[:, :1].expand(-1, 4, -1) + 0,
    "slice": lambda m, x: x[:, 1:5:2] * 3,
    "slice_neg": lambda m, x: x[..., -3:] * 3,
    "select": lambda m, x: x[:, 2] * 3,
    "cat": lambda m, x: torch.cat([x, x * 2], 1),
    "cat_last": lambda m, x: torch.cat([x * 2, x, x + 1], -1),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_ops(rt, pipeline_program, name):
    torch.manual_seed(5)
    _run_case(rt, pipeline_program, Fn(SHAPE_OPS[name]), [torch.randn(3, 6, 5)])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_shape_ops_int(rt, pipeline_program, dtype):
    x = torch.randint(-9, 9, (4, 5), dtype=dtype)
    _run_case(rt, pipeline_program, Fn(lambda m, x: torch.cat([x.t(), x.t()], 0) + x.t()[:1]), [x])


def test_embedding(rt, pipeline_program):
    torch.manual_seed(6)
    emb = nn.Embedding(50, 8)
    _run_case(rt, pipeline_program, emb, [torch.randint(0, 50, (3, 7))])


def test_dynamic_shapes_sym_size(rt, tmp_path):
    """A batch-dynamic program with symbolic sizes (sym_size, view, cat, slice) runs at every
    batch size within its bound, resizing outputs at run time."""
    from rt_helpers import build_with_pipeline

    class M(nn.Module):
        def forward(self, x):
            y = x.reshape(x.shape[0], -1)
            return torch.cat([y, y * 2], 1)[:, : x.shape[1] * 3] * 1.5

    overrides = ["model.inputs=[{name:features,shape:[4,5,6]}]"]  # batch 1..16 on dim 0
    path = build_with_pipeline(M(), [torch.randn(4, 5, 6)], tmp_path / "dyn", overrides)
    prog = rt.load(str(path))
    for batch in (1, 3, 16, 7):
        x = torch.randn(batch, 5, 6)
        (got,) = prog.run([x])
        assert_matches(got, M()(x))
    prog.run([torch.randn(2, 5, 6)], profile=True)
    assert "aten::sym_size.int" in [name for name, _ in prog.last_profile]


def test_dynamic_symbolic_arithmetic(rt, tmp_path):
    """Sizes computed from symbolic sizes (executorch_prim ops on Int values)."""
    from rt_helpers import build_with_pipeline

    class M(nn.Module):
        def forward(self, x):
            n = x.shape[0]
            y = x.reshape(n * 5, 6) * 2
            return y.reshape((n + 2) - 2, 30) + 1

    overrides = ["model.inputs=[{name:features,shape:[4,5,6]}]"]
    path = build_with_pipeline(M(), [torch.randn(4, 5, 6)], tmp_path / "dyn", overrides)
    prog = rt.load(str(path))
    for batch in (1, 2, 5, 16):
        x = torch.randn(batch, 5, 6)
        (got,) = prog.run([x])
        assert_matches(got, M()(x))
    prog.run([torch.randn(3, 5, 6)], profile=True)
    names = {name for name, _ in prog.last_profile}
    assert any(n.startswith("executorch_prim::") for n in names), names
