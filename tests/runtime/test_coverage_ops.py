"""Coverage ops that torch.export's core-ATen decomposition produces for common models: group
norm, log-softmax, variance (torch.var / torch.std), argmax/argmin and max/min along a dim,
cumsum, comparisons and where, index_select / gather, bilinear upsampling, reflect and
replicate padding, casts, full_like, any and logical_not. Each against torch eager on seeded
randomized shapes (size-1 dims, odd sizes), several ops per program to keep builds few, and
small models that use the torch-level calls built end to end through the pipeline."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F
from rt_helpers import assert_matches, build_with_pipeline
from torch import nn


def _check(rt, pipeline_program, module, inputs, rel=1e-4, profile=()):
    """Builds `module`, runs it on `inputs` and compares every output with eager; checks that
    the kernels named in `profile` ran."""
    module.eval()
    with torch.no_grad():
        want = module(*inputs)
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    prog = rt.load(str(pipeline_program(module, inputs)))
    got = prog.run(list(inputs), profile=bool(profile))
    if profile:
        ran = {name for name, _ in prog.last_profile}
        assert set(profile) <= ran, ran
    assert len(got) == len(wants)
    for g, w in zip(got, wants, strict=True):
        assert_matches(g, w, rel)
    return prog, wants


def _shape(rng: random.Random, lo: int, hi: int) -> list[int]:
    return [rng.choice([1, 2, 3, 5, 7]) for _ in range(rng.randint(lo, hi))]


# ---- group norm, log-softmax, var / std ----------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_group_norm_log_softmax_var(rt, pipeline_program, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    groups, per_group = [2, 1, 3][seed % 3], rng.choice([1, 2, 3])
    C = groups * per_group
    shape = [rng.choice([1, 2, 3]), C, *_shape(rng, 0 if seed == 0 else 1, 2)]
    nd = len(shape)
    sm_dim = rng.randrange(-nd, nd)
    var_dims = sorted(rng.sample(range(nd), rng.randint(1, nd)))
    keepdim = bool(seed % 2)
    # unbiased estimates need two elements or more (one gives NaN, as in torch)
    while all(shape[d] == 1 for d in var_dims):
        shape[var_dims[-1]] = 3
    correction = [1, 0, 2][seed % 3] if math.prod(shape[d] for d in var_dims) > 2 else 0
    std_dim = max(range(nd), key=lambda d: shape[d])

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gn = nn.GroupNorm(groups, C, eps=1e-3)
            with torch.no_grad():
                self.gn.weight.copy_(torch.rand(C, generator=gen) + 0.5)
                self.gn.bias.copy_(torch.randn(C, generator=gen))

        def forward(self, x):
            return (
                self.gn(x),
                F.group_norm(x * 2 + 1, groups),
                F.log_softmax(x, sm_dim),
                torch.var(x, var_dims, correction=correction, keepdim=keepdim),
                torch.std(x, std_dim, keepdim=not keepdim),
                torch.var(x) * 3,
            )

    x = torch.randn(shape, generator=gen) * 2 + 0.5
    _check(rt, pipeline_program, M(), [x],
           profile=["aten::native_group_norm.out", "aten::_log_softmax.out",
                    "aten::var.correction_out"])  # fmt: skip


# ---- argmax / argmin, max / min along a dim, cumsum ----------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_arg_extremes_and_cumsum(rt, pipeline_program, seed):
    rng = random.Random(10 + seed)
    gen = torch.Generator().manual_seed(seed)
    shape = _shape(rng, 1, 4)
    nd = len(shape)
    d1, d2, d3 = (rng.randrange(-nd, nd) for _ in range(3))
    keep = bool(seed % 2)

    class M(nn.Module):
        def forward(self, x, xl, xi, mask):
            mx = torch.max(x, d1, keepdim=keep)
            mn = torch.min(xi, d2, keepdim=not keep)
            return (
                torch.argmax(x),
                torch.argmin(x, keepdim=True),
                torch.argmax(x, d2, keepdim=keep),
                torch.argmin(xl, d3),
                mx.values,
                mx.indices,
                mn.values,
                mn.indices,
                torch.max(xl, d3)[1],
                torch.cumsum(x * 0.5, d1),
                torch.cumsum(xl, d2),
                torch.cumsum(xi, d3),
                torch.cumsum(mask, -1),
            )

    # few distinct values: ties everywhere, which must resolve to the first index
    x = torch.randint(-3, 4, shape, generator=gen).float() + (seed % 3 == 2) * torch.randn(shape)
    xl = torch.randint(-4, 5, shape, generator=gen) * 1000
    xi = torch.randint(-2, 3, shape, generator=gen, dtype=torch.int32)
    mask = torch.rand(shape, generator=gen) < 0.5
    _check(rt, pipeline_program, M(), [x, xl, xi, mask],
           profile=["aten::argmax.out", "aten::argmin.out", "aten::max.dim_max",
                    "aten::min.dim_min", "aten::cumsum.out"])  # fmt: skip


# ---- comparisons and where -----------------------------------------------------------------


def _broadcast_pair(rng: random.Random) -> tuple[list[int], list[int]]:
    a = _shape(rng, 1, 4)
    b = [s if rng.random() < 0.6 else 1 for s in a]
    if rng.random() < 0.4:
        b = b[rng.randint(0, len(a) - 1) :]  # fewer dims
    return (a, b) if rng.random() < 0.5 else (b, a)


@pytest.mark.parametrize("seed", range(5))
def test_comparisons_and_where(rt, pipeline_program, seed):
    rng = random.Random(20 + seed)
    gen = torch.Generator().manual_seed(seed)
    sa, sb = _broadcast_pair(rng)
    sc = [s if rng.random() < 0.5 else 1 for s in torch.broadcast_shapes(sa, sb)]
    sc = sc[rng.randint(0, 1) :]  # the condition broadcasts too

    def ints(shape, dtype=torch.int64):  # few distinct values: equal pairs are common
        return torch.randint(-2, 3, shape, generator=gen, dtype=dtype)

    class M(nn.Module):
        def forward(self, x, y, xl, yl, xi, yi, xb, yb, c):
            return (
                x == y, x != y, x < y, x <= y, x > y, x >= y,
                xl == yl, xl < yl, xi >= yi, xi != yi, xb == yb, xb > yb,
                x <= yl, xi < yl,  # mixed dtypes compare in the promoted type
                x == 1, x != 0.5, x < 0, xl <= 1, xl > 0.5, xi >= -1, xb == 1,
                torch.where(c, x, y), torch.where(c, xl, yl), torch.where(c, xi, yi),
                torch.where(c, xb, yb), torch.where(x > 0, x, 0.5),
                torch.where(xl > 0, xl, -1), torch.where(c, x, xl),
            )  # fmt: skip

    inputs = [
        ints(sa).float() * 0.5, ints(sb).float() * 0.5, ints(sa), ints(sb),
        ints(sa, torch.int32), ints(sb, torch.int32), ints(sa) > 0, ints(sb) > 0,
        torch.rand(sc, generator=gen) < 0.5,
    ]  # fmt: skip
    ran = ["aten::eq.Tensor_out", "aten::ne.Scalar_out", "aten::where.self_out"]
    _check(rt, pipeline_program, M(), inputs, profile=ran)


# ---- index_select and gather ---------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_index_select_and_gather(rt, pipeline_program, seed):
    rng = random.Random(30 + seed)
    gen = torch.Generator().manual_seed(seed)
    shape = _shape(rng, 1, 4)
    nd = len(shape)
    d1, d2 = rng.randrange(-nd, nd), rng.randrange(nd)
    idx1 = torch.randint(0, shape[d1], (rng.choice([1, 4, 9]),), generator=gen)
    gshape = [rng.randint(1, s) for s in shape]  # at most self's size off the gathered dim
    gshape[d2] = rng.choice([1, 3, 6])
    idx2 = torch.randint(0, shape[d2], gshape, generator=gen, dtype=torch.int32)
    const = torch.randint(0, shape[-1], (5,), generator=gen)

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("const", const)

        def forward(self, x, xl, xb, i1, i1i, i2, i2l):
            return (
                torch.index_select(x, d1, i1),
                torch.index_select(xl, d1, i1i),
                torch.index_select(xb, -1, self.const),
                torch.index_select(x, d1, i1[0]),  # a 0-d index keeps the dim
                torch.gather(x, d2, i2),
                torch.gather(xl, d2, i2l),
                torch.gather(xb, d2, i2),
            )

    x = torch.randn(shape, generator=gen)
    xl = torch.randint(-100, 100, shape, generator=gen)
    xb = torch.rand(shape, generator=gen) < 0.5
    ran = ["aten::index_select.out", "aten::gather.out"]
    inputs = [x, xl, xb, idx1, idx1.int(), idx2, idx2.long()]
    _check(rt, pipeline_program, M(), inputs, profile=ran)


def test_index_out_of_range_is_an_error(rt, pipeline_program):
    class M(nn.Module):
        def forward(self, x, i, j):
            return torch.index_select(x, 1, i), torch.gather(x, 0, j)

    x = torch.randn(3, 4)
    i, j = torch.tensor([0, 3]), torch.zeros(2, 4, dtype=torch.long)
    prog = rt.load(str(pipeline_program(M(), [x, i, j])))
    assert_matches(prog.run([x, i, j])[0], M()(x, i, j)[0])
    with pytest.raises(rt.Error, match=r"index_select: index 4 is out of range .* size 4"):
        prog.run([x, torch.tensor([0, 4]), j])
    with pytest.raises(rt.Error, match=r"gather: index -1 is out of range .* size 3"):
        prog.run([x, i, j - 1])


# ---- bilinear upsampling -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_bilinear_upsample(rt, pipeline_program, seed):
    rng = random.Random(40 + seed)
    gen = torch.Generator().manual_seed(seed)
    shape = [rng.choice([1, 2]), rng.choice([1, 3]), rng.choice([1, 2, 5]), rng.choice([1, 4, 7])]
    scale = [2.0, 1.5, (0.5, 1.7)][seed % 3]
    size = (rng.randint(1, 9), rng.randint(1, 9))

    class M(nn.Module):
        def forward(self, x):
            return tuple(
                F.interpolate(x, mode="bilinear", align_corners=ac, **kw)
                for ac in (False, True)
                for kw in ({"scale_factor": scale}, {"size": size})
            ) + (F.interpolate(x, scale_factor=2, mode="nearest"),)  # fmt: skip

    x = torch.randn(shape, generator=gen)
    ran = ["aten::upsample_bilinear2d.vec_out", "aten::upsample_nearest2d.vec_out"]
    _check(rt, pipeline_program, M(), [x], profile=ran)


# ---- reflect and replicate padding -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_reflect_and_replicate_padding(rt, pipeline_program, seed):
    rng = random.Random(60 + seed)
    gen = torch.Generator().manual_seed(seed)
    h, w = rng.randint(2, 7), rng.randint(2, 9)
    # reflect needs each pad smaller than its dim; replicate takes any size
    p1 = (rng.randint(0, w - 1), rng.randint(0, w - 1))
    p2 = (*p1, rng.randint(0, h - 1), rng.randint(0, h - 1))
    r2 = (rng.randint(0, 9), rng.randint(0, 3), rng.randint(0, 9), rng.randint(0, 3))

    class M(nn.Module):
        def forward(self, x, seq):
            return (
                F.pad(x, p2, mode="reflect"),
                F.pad(x, r2, mode="replicate"),
                F.pad(seq, p1, mode="reflect"),
                F.pad(seq, r2[:2], mode="replicate"),
                F.pad(x[0], p2, mode="reflect"),  # a 3-d input: one image without a batch
                F.pad(x.long(), r2, mode="replicate"),
            )

    x = torch.randn(rng.choice([1, 2]), rng.choice([1, 3]), h, w, generator=gen)
    seq = torch.randn(rng.choice([1, 2]), rng.choice([1, 4]), w, generator=gen)
    ran = [
        "aten::reflection_pad2d.out",
        "aten::replication_pad2d.out",
        "aten::reflection_pad1d.out",
        "aten::replication_pad1d.out",
    ]
    _check(rt, pipeline_program, M(), [x, seq], profile=ran)


def test_reflect_padding_as_wide_as_the_input_is_an_error(rt, tmp_path):
    """A sequence of dynamic length shorter than the export's bound allows: the kernel refuses
    what torch refuses."""

    class M(nn.Module):
        def forward(self, x):
            return F.pad(x, (2, 1), mode="reflect")

    dims = "model.dynamic_dims=[{name:len,input:features,dim:2,min:3,max:16}]"
    pte = build_with_pipeline(M(), [torch.randn(1, 2, 5)], tmp_path, overrides=[dims])
    prog = rt.load(str(pte))
    assert_matches(
        prog.run([torch.arange(9.0).view(1, 1, 9)])[0],
        F.pad(torch.arange(9.0).view(1, 1, 9), (2, 1), mode="reflect"),
    )
    with pytest.raises(RuntimeError, match=r"padding \(2, 1\) of dim 2 must be smaller than"):
        prog.run([torch.randn(1, 2, 2)])


# ---- casts, fills, any, logical_not and mul by a number ------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_casts_fills_any_and_logical_not(rt, pipeline_program, seed):
    rng = random.Random(70 + seed)
    gen = torch.Generator().manual_seed(seed)
    shape = _shape(rng, 1, 3)
    nd = len(shape)
    dim = rng.randrange(-nd, nd)
    dims = sorted(rng.sample(range(nd), rng.randint(1, nd)))
    number = [2.5, -3, 0.125][seed % 3]

    class M(nn.Module):
        def forward(self, x, n):
            big = x * 40
            return (
                big.long(),  # truncates toward zero
                big.int().float() + n.float(),
                (x > 0).to(torch.int32) + n,
                n.to(torch.int8),
                (x > 0.5).float(),
                torch.full_like(x, number),
                torch.full_like(n, 7),
                torch.logical_not(torch.zeros_like(x, dtype=torch.bool)),
                torch.logical_not(x > 0),
                torch.logical_not(n),
                (x > 0.5).any(dim=dim),
                torch.any(x > 1.0, dim=dims, keepdim=bool(seed % 2)),
                torch.any(n == 3),
                torch.ops.aten.mul.Scalar(x, number),
                torch.ops.aten.mul.Scalar(n, 3),
            )

    x = torch.randn(shape, generator=gen) * 2
    n = torch.randint(-300, 300, shape, generator=gen)
    n.view(-1)[0] = 0
    ran = [
        "aten::_to_copy.out",
        "aten::full_like.out",
        "aten::logical_not.out",
        "aten::any.out",
        "aten::any.dims_out",
        "aten::mul.Scalar_out",
    ]
    _check(rt, pipeline_program, M(), [x, n], profile=ran)


# ---- small models that use the torch-level calls, end to end -------------------------------


class SegHead(nn.Module):
    """A segmentation head: conv, GroupNorm, SiLU, bilinear upsampling, per-pixel log-softmax
    over the classes, the predicted class and its score."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(4, 8)
        self.cls = nn.Conv2d(8, 5, 1)

    def forward(self, x):
        h = F.silu(self.norm(self.conv(x)))
        h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        logp = F.log_softmax(self.cls(h), dim=1)
        score, label = torch.max(logp, dim=1)
        return logp, label, score, torch.argmax(logp, dim=1)


class MaskedPool(nn.Module):
    """A sequence encoder: features standardized by their std, positions from a cumsum over the
    padding mask, padded steps masked with where, max/argmin over time, scores of picked
    classes with gather and index_select."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.proj = nn.Linear(6, 4)
        self.register_buffer("keep", torch.tensor([3, 0, 2]))

    def forward(self, x, mask, target):
        h = self.proj(x)
        h = (h - h.mean(-1, keepdim=True)) / torch.std(h, -1, keepdim=True)
        pos = torch.cumsum(mask, 1)  # 1, 2, ... over the valid steps
        h = torch.where(mask.unsqueeze(-1), h, -1e4) + pos.unsqueeze(-1) * 0.1
        pooled, at = torch.max(h, 1)
        return (
            pooled,
            at,
            torch.argmin(torch.var(x, -1), 1),
            torch.gather(pooled, 1, target),
            torch.index_select(pooled, 1, self.keep),
            pos >= 2,
        )


@pytest.mark.parametrize("model", ["seg", "pool"])
def test_models_with_coverage_ops_build_end_to_end(rt, pipeline_program, model):
    gen = torch.Generator().manual_seed(5)
    if model == "seg":
        module, inputs = SegHead(), [torch.randn(2, 3, 5, 7, generator=gen)]
    else:
        mask = torch.arange(9)[None, :] < torch.tensor([[9], [4], [6]])
        target = torch.randint(0, 4, (3, 2), generator=gen)
        module, inputs = MaskedPool(), [torch.randn(3, 9, 6, generator=gen), mask, target]
    _, wants = _check(rt, pipeline_program, module, inputs)
    assert wants[0].std() > 0.1
