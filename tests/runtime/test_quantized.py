"""The runtime's int8 kernels (runtime_src/kernels/quantized/) against their reference
semantics (pipeline/quant/ops.py), on randomized shapes and quantization parameters.

Each case is a module that calls one ``etb_quantized`` op on its (int8 or fp32) inputs and
constant buffers; etbuild's pipeline builds it into a program and the runtime's output must be
*exactly* the reference op's output: the kernels implement the same float32 operations in the
same order (no fused multiply-add), round half to even and clamp the same way, and sum the
integer products exactly.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

pytest.importorskip("torchao")

from etbuild.pipeline.quant import ops as qops  # noqa: E402

Q = qops.ops


class Op(nn.Module):
    """Calls ``fn(self, *inputs)``; constant tensors are buffers (program constants)."""

    def __init__(self, fn, **consts: torch.Tensor | None) -> None:
        super().__init__()
        self.fn = fn
        self.none = [k for k, v in consts.items() if v is None]
        for k, v in consts.items():
            if v is not None:
                self.register_buffer(k, v)

    def c(self, name: str) -> torch.Tensor | None:
        return None if name in self.none else getattr(self, name)

    def forward(self, *xs):
        return self.fn(self, *xs)


def run_exact(
    rt, pipeline_program, module: nn.Module, inputs: list[torch.Tensor], threads: int = 1
) -> None:
    """The program of ``module`` gives the reference's output exactly, with its weights
    prepared at load (the default) and without (each call packs its own). With threads, each
    program runs three times: in a first run the caller may finish every task before a
    sleeping worker wakes."""
    module.eval()
    with torch.no_grad():
        want = module(*inputs)
    pte = str(pipeline_program(module, inputs))
    for prepare in (True, False):
        program = rt.load(pte, threads=threads, prepare=prepare)
        for _ in range(3 if threads > 1 else 1):
            (got,) = program.run(list(inputs))
            assert_exact(got, want)


def assert_exact(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.shape, want.shape)
    if want.dtype == torch.int8:
        diff = (got.int() - want.int()).abs()
        assert diff.max().item() == 0 if diff.numel() else True, (
            f"{int((diff != 0).sum())} of {diff.numel()} elements differ, max {diff.max()}"
        )
    else:
        assert torch.equal(got, want), (got - want).abs().max()


def i8(shape, gen, lo=-128, hi=127) -> torch.Tensor:
    return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int8)


def out_params(rng: random.Random) -> tuple[int, int, int]:
    """Output zero point and clamp bounds: plain, ReLU (lo = zp), ReLU6-like, extremes."""
    zp = rng.choice([-128, -3, 0, 5, 127])
    kind = rng.choice(["plain", "relu", "relu6", "narrow"])
    if kind == "relu":
        return zp, zp, 127
    if kind == "relu6":
        return zp, max(-128, zp), min(127, zp + 60)
    if kind == "narrow":
        return zp, -127, 100
    return zp, -128, 127


def weight_scales(rng: random.Random, gen, channels: int) -> torch.Tensor:
    if rng.random() < 0.3:  # per-tensor: one scale repeated
        return torch.full((channels,), rng.uniform(0.001, 0.02))
    return torch.rand(channels, generator=gen) * 0.02 + 0.0005


# ---- conv2d ------------------------------------------------------------------------------


def conv_case(seed: int) -> tuple[dict, torch.Tensor]:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    kind = ["dense", "depthwise", "grouped", "pointwise", "depthwise_mult", "strided_1x1"][seed % 6]
    n = rng.choice([1, 2])
    if kind == "depthwise":
        c = rng.choice([3, 8, 17])
        oc, groups = c, c
    elif kind == "depthwise_mult":
        c = rng.choice([2, 5])
        oc, groups = 2 * c, c
    elif kind == "grouped":
        groups = rng.choice([2, 3])
        c, oc = groups * rng.choice([1, 3, 4]), groups * rng.choice([2, 5])
    else:
        groups, c, oc = 1, rng.choice([1, 3, 16, 33]), rng.choice([1, 7, 24, 40])
    if kind in ("pointwise", "strided_1x1"):
        kh = kw = 1
    else:
        kh, kw = rng.choice([(3, 3), (1, 3), (5, 5), (2, 3)])
    stride = [2, 2] if kind == "strided_1x1" else [rng.choice([1, 2, 3]), rng.choice([1, 2])]
    if kind == "pointwise":
        stride, padding, dilation = [1, 1], [0, 0], [1, 1]
    else:
        padding = [rng.randint(0, kh // 2 + 1), rng.randint(0, kw // 2)]
        dilation = [rng.choice([1, 1, 2]), 1]
    h, w = rng.choice([1, 5, 9, 14]) + kh * dilation[0], rng.choice([1, 6, 11, 31]) + kw
    x = i8((n, c, h, w), gen)
    ozp, lo, hi = out_params(rng)
    args = dict(
        xs=rng.uniform(0.01, 0.1),
        xzp=rng.choice([-128, -7, 0, 12, 127]),
        w=i8((oc, c // groups, kh, kw), gen, -127, 127),
        ws=weight_scales(rng, gen, oc),
        b=None if rng.random() < 0.3 else torch.randn(oc, generator=gen),
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        os=rng.uniform(0.02, 0.3),
        ozp=ozp,
        lo=lo,
        hi=hi,
    )
    return args, x


def conv_module(a: dict) -> Op:
    return Op(
        lambda m, x: Q.conv2d(
            x,
            a["xs"],
            a["xzp"],
            m.w,
            m.ws,
            m.c("b"),
            a["stride"],
            a["padding"],
            a["dilation"],
            a["groups"],
            a["os"],
            a["ozp"],
            a["lo"],
            a["hi"],
        ),  # fmt: skip
        w=a["w"],
        ws=a["ws"],
        b=a["b"],
    )


@pytest.mark.parametrize("seed", range(18))
def test_conv2d_randomized(rt, pipeline_program, seed):
    args, x = conv_case(seed)
    run_exact(rt, pipeline_program, conv_module(args), [x])


@pytest.mark.parametrize(
    "shape",
    [
        # (N, C, H, W, OC, k, stride, pad, groups): paths and block edges
        (1, 600, 5, 7, 37, 1, 1, 0, 1),  # deep pointwise
        (1, 16, 40, 41, 9, 1, 1, 0, 1),  # many pixels: several packed column blocks
        (1, 40, 64, 64, 20, 1, 1, 0, 1),  # rows 4 KiB apart, packed a cache line of each a task
        (1, 3, 33, 35, 32, 3, 2, 1, 1),  # MobileNet's first conv
        (2, 24, 15, 15, 24, 3, 2, 1, 24),  # depthwise, stride 2
        (1, 4, 26, 26, 4, 23, 1, 11, 4),  # depthwise, 529 taps: channel lanes (x86) or generic
        (1, 8, 1, 1, 8, 1, 1, 0, 1),  # 1x1 spatial
        (1, 96, 7, 7, 40, 1, 1, 0, 1),  # a 7x7 plane: its 49th column by dot products
        # K = 3 * 41 * 41 = 5043 (odd): weights packed in 3 chunks of rows, 4 column blocks
        (1, 3, 24, 25, 290, 41, 1, 20, 1),
    ],
)
def test_conv2d_paths(rt, pipeline_program, shape):
    run_conv_shape(rt, pipeline_program, shape)


@pytest.mark.parametrize(
    "shape, dilation",
    [
        # the taps path (an implicit GEMM over the input split into its stride's phases)
        ((1, 8, 20, 23, 12, 3, 4, 1, 1), 1),  # stride 4: three of the four phases a row
        ((1, 12, 17, 19, 10, 2, 2, 0, 1), 2),  # every tap in phase 0: one phase plane
        ((1, 16, 15, 16, 9, 3, 3, 2, 1), 2),  # stride 3, dilation 2: phases 0, 2, 1
        ((2, 24, 11, 9, 20, 3, 2, 1, 2), 1),  # groups of 12 channels, two images
        ((1, 35, 7, 7, 70, 3, 1, 1, 1), 1),  # 35 channels: a tap's last word one short
        # stride 5: past the phases the taps path keeps, im2col
        ((1, 8, 21, 22, 12, 3, 5, 1, 1), 1),
    ],
)
def test_conv2d_strides_dilations_and_groups(rt, pipeline_program, shape, dilation):
    run_conv_shape(rt, pipeline_program, shape, dilation=dilation)


def run_conv_shape(rt, pipeline_program, shape, threads: int = 1, dilation: int = 1) -> None:
    """A convolution of shape (N, C, H, W, OC, k, stride, pad, groups), seeded by its shape,
    run at `threads` threads against the reference."""
    n, c, h, w, oc, k, s, p, g = shape
    gen = torch.Generator().manual_seed(sum(shape))
    rng = random.Random(sum(shape))
    args = dict(xs=0.04, xzp=-9, w=i8((oc, c // g, k, k), gen, -127, 127),
                ws=weight_scales(rng, gen, oc), b=torch.randn(oc, generator=gen),
                stride=[s, s], padding=[p, p], dilation=[dilation, dilation], groups=g,
                os=0.5 + c / 10, ozp=4, lo=-128, hi=127)  # fmt: skip
    run_exact(rt, pipeline_program, conv_module(args), [i8((n, c, h, w), gen)], threads)


@pytest.mark.parametrize(
    "shape",
    [
        # (N, C, H, W, OC, k, stride, pad, groups)
        (1, 16, 40, 41, 9, 1, 1, 0, 1),  # pointwise: the threads split runs of column panels
        (1, 40, 64, 64, 20, 1, 1, 0, 1),  # rows 4 KiB apart, in groups of panels
        # pointwise and deep: a run of panels is more than a thread's share of the B block
        # holds, so it goes in groups of panels, the last group of a run partial
        (1, 520, 75, 77, 9, 1, 1, 0, 1),
        (1, 120, 7, 7, 45, 1, 1, 0, 1),  # pointwise on 7x7: slivers with the dot column split
        # pointwise, few rows over a deep input on a small plane: the depth in halves, each
        # half on its share of the threads (MobileNetV2's 384 -> 64 at 14x14), then an odd
        # depth (64 + 65), and groups over two images (at 3 and 4 threads, two runs of rows)
        (1, 384, 14, 14, 64, 1, 1, 0, 1),
        (1, 129, 7, 7, 40, 1, 1, 0, 1),
        (2, 256, 9, 9, 20, 1, 1, 0, 2),
        # pointwise on 14x14 (7 panels), odd depth: B packed in runs of steps times panels,
        # the last step partial
        (1, 99, 14, 14, 24, 1, 1, 0, 1),
        (1, 8, 48, 45, 20, 3, 1, 1, 1),  # 3x3, taps path: the threads split runs of panels
        (2, 12, 30, 33, 18, 3, 2, 1, 3),  # grouped, two images: tasks over group and run
        # a small plane, weights bigger than the layout: chunks of rows (at 3 and 4 threads
        # every sliver is a chunk), then runs of panels
        (1, 24, 9, 9, 40, 3, 1, 1, 1),
        # and with slivers for chunks alone (20 on AVX-512, 27 on AVX2): each thread fills a
        # copy of the layout of its own
        (1, 32, 9, 9, 160, 3, 1, 1, 1),
        # a layout bigger than a block (215 KiB or more): runs of panels, several blocks each
        (1, 64, 56, 56, 12, 3, 1, 1, 1),
        # im2col (3 channels): a 28x28 plane's 49 steps of 16 columns dealt into tiles of 6
        # or 7 (2 threads: 8), each task packing and multiplying a tile
        (1, 3, 28, 28, 24, 3, 1, 1, 1),
        (1, 8, 40, 40, 12, 3, 5, 1, 1),  # im2col (stride 5), tiles over the threads
        # a 7x7 stem on RGB: at 2 threads a tile (14-15 steps) is wider than a group of
        # panels (6 of depth 147), so a tile goes in groups, its last one partial
        (1, 3, 170, 170, 20, 7, 2, 3, 1),
        # weights too big to widen at once: column tiles one after another, each a product
        # whose B is one block (tiles of 3 or 4 panels at 2 threads)
        (1, 3, 24, 25, 290, 41, 1, 20, 1),
    ],
)
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_conv2d_split_over_threads_is_exact(rt, pipeline_program, shape, threads):
    run_conv_shape(rt, pipeline_program, shape, threads)


def test_conv2d_large_accumulators_round_like_the_reference(rt, pipeline_program):
    """|acc| > 2^24: float32(acc) rounds; the kernel converts exactly like the reference."""
    gen = torch.Generator().manual_seed(0)
    c = 2048
    w = torch.where(torch.rand(5, c, 1, 1, generator=gen) < 0.9, -128, 127).to(torch.int8)
    x = torch.full((1, c, 2, 3), 127, dtype=torch.int8)
    x[0, :7, 0, 0] = -128
    args = dict(xs=0.01, xzp=-128, w=w, ws=torch.full((5,), 1e-5), b=None, stride=[1, 1],
                padding=[0, 0], dilation=[1, 1], groups=1, os=0.013, ozp=0, lo=-128,
                hi=127)  # fmt: skip
    run_exact(rt, pipeline_program, conv_module(args), [x])


def test_conv2d_ties_round_half_to_even(rt, pipeline_program):
    x = torch.tensor([[[[1, 3, 5, 100, -1, -3]]]], dtype=torch.int8)
    args = dict(xs=1.0, xzp=0, w=torch.ones(1, 1, 1, 1, dtype=torch.int8),
                ws=torch.tensor([0.5]), b=None, stride=[1, 1], padding=[0, 0], dilation=[1, 1],
                groups=1, os=1.0, ozp=0, lo=-128, hi=20)  # fmt: skip
    module = conv_module(args)
    assert module(x).flatten().tolist() == [0, 2, 2, 20, 0, -2]
    run_exact(rt, pipeline_program, module, [x])


# ---- depthwise conv2d: the direct path (square 3x3 / 5x5, stride 1 or 2, no dilation) ------


def depthwise_case(seed: int) -> tuple[dict, torch.Tensor]:
    """A depthwise conv the direct path takes: widths below, within and above one SIMD
    vector, channel counts that are no multiple of a vector, padding 0 up to k - 1."""
    rng = random.Random(1000 + seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    k = [3, 3, 5][seed % 3]
    s = [1, 2][(seed // 3) % 2]
    ph = rng.choice([0, 1, 1, k - 1])
    pw = rng.choice([0, 1, 1, k - 1])
    c = rng.choice([1, 3, 8, 17, 33])
    mult = rng.choice([1, 1, 1, 2])  # output channels per input channel
    h = max(1, k - 2 * ph) + rng.choice([0, 1, 4, 7, 12])
    w = max(1, k - 2 * pw) + rng.choice([0, 2, 5, 6, 9, 14, 15, 16, 23, 40])
    x = i8((rng.choice([1, 2]), c, h, w), gen)
    ozp, lo, hi = out_params(rng)
    args = dict(
        xs=rng.uniform(0.01, 0.1),
        xzp=rng.choice([-128, -7, 0, 12, 127]),
        w=i8((c * mult, 1, k, k), gen, -128, 127),
        ws=weight_scales(rng, gen, c * mult),
        b=None if rng.random() < 0.3 else torch.randn(c * mult, generator=gen),
        stride=[s, s],
        padding=[ph, pw],
        dilation=[1, 1],
        groups=c,
        os=rng.uniform(0.02, 0.3),
        ozp=ozp,
        lo=lo,
        hi=hi,
    )
    return args, x


@pytest.mark.parametrize("seed", range(24))
def test_conv2d_depthwise_direct_randomized(rt, pipeline_program, seed):
    args, x = depthwise_case(seed)
    run_exact(rt, pipeline_program, conv_module(args), [x])


@pytest.mark.parametrize(
    "shape",
    [
        # (N, C, H, W, channel multiplier, k, stride, pad, clamp): MobileNetV2's layers and edges
        (1, 32, 112, 112, 1, 3, 1, 1, "relu6"),
        (1, 96, 112, 112, 1, 3, 2, 1, "relu6"),
        (1, 144, 28, 28, 1, 3, 2, 1, "relu"),
        (1, 960, 7, 7, 1, 3, 1, 1, "relu6"),
        (2, 5, 9, 8, 1, 3, 1, 0, "plain"),  # a row of exactly 8 and of 16 output columns
        (1, 7, 17, 33, 1, 3, 2, 0, "plain"),  # odd sizes, no padding
        (1, 3, 16, 16, 2, 3, 1, 1, "relu"),  # a row of exactly 16
        (1, 6, 1, 1, 1, 3, 1, 1, "plain"),  # one pixel: all but one tap is padding
        (1, 4, 2, 3, 1, 3, 2, 2, "plain"),  # outputs that see only padding
        (1, 9, 19, 21, 1, 5, 2, 2, "relu6"),
        (2, 11, 13, 6, 3, 5, 1, 4, "plain"),
    ],
)
def test_conv2d_depthwise_direct_paths(rt, pipeline_program, shape):
    n, c, h, w, mult, k, s, p, clamp = shape
    gen = torch.Generator().manual_seed(sum(shape[:-1]))
    rng = random.Random(sum(shape[:-1]))
    lo, hi = {"plain": (-128, 127), "relu": (-5, 127), "relu6": (-5, 70)}[clamp]
    args = dict(xs=0.03, xzp=-5 if clamp == "plain" else -128,
                w=i8((c * mult, 1, k, k), gen, -127, 127), ws=weight_scales(rng, gen, c * mult),
                b=torch.randn(c * mult, generator=gen), stride=[s, s], padding=[p, p],
                dilation=[1, 1], groups=c, os=0.05, ozp=-5, lo=lo, hi=hi)  # fmt: skip
    run_exact(rt, pipeline_program, conv_module(args), [i8((n, c, h, w), gen)])


@pytest.mark.parametrize(
    "shape",
    [
        # (N, C, H, W, channel multiplier, kernel, stride, padding, dilation, threads)
        (1, 13, 7, 7, 1, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # a last block of 5 channels
        (2, 5, 6, 9, 2, (3, 3), (2, 2), (1, 1), (1, 1), 1),  # multiplier 2; the tensor's end
        (1, 8, 3, 2, 1, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # a plane of 6 outputs (< 8)
        # 12 outputs (< 16), two whole blocks of 16 and one of 5
        (1, 37, 4, 3, 1, (3, 3), (1, 1), (1, 1), (1, 1), 1),
        (1, 16, 9, 9, 1, (7, 7), (1, 1), (3, 3), (1, 1), 1),  # a 7x7 kernel
        (1, 9, 16, 17, 1, (3, 3), (3, 2), (1, 0), (2, 1), 1),  # stride 3, dilation 2
        (1, 11, 14, 14, 1, (1, 2), (1, 1), (0, 1), (1, 1), 1),  # a 1x2 kernel
        (3, 20, 14, 14, 1, (3, 3), (2, 2), (1, 1), (1, 1), 3),  # blocks over 3 threads
        (3, 40, 8, 8, 1, (3, 3), (1, 1), (1, 1), (1, 1), 3),  # the same, an 8x8 plane (AVX-512)
        (1, 24, 28, 28, 1, (3, 3), (2, 2), (1, 1), (1, 1), 2),
    ],
)
def test_conv2d_depthwise_on_channel_lanes(rt, pipeline_program, shape):
    """Small planes, strided and general shapes, which AVX2 and AVX-512 builds run 8 or 16
    channels to a vector: partial blocks, planes smaller than a vector, kernels, strides and
    dilations the planes path does not take, threads splitting the blocks."""
    n, c, h, w, mult, k, stride, padding, dilation, threads = shape
    gen = torch.Generator().manual_seed(c * h + w)
    rng = random.Random(c * h + w)
    args = dict(xs=0.04, xzp=rng.choice([-128, 9, 127]), w=i8((c * mult, 1, *k), gen),
                ws=weight_scales(rng, gen, c * mult), b=torch.randn(c * mult, generator=gen),
                stride=list(stride), padding=list(padding), dilation=list(dilation), groups=c,
                os=0.06, ozp=-3, lo=-100, hi=90)  # fmt: skip
    run_exact(rt, pipeline_program, conv_module(args), [i8((n, c, h, w), gen)], threads=threads)


def test_conv2d_depthwise_extreme_values(rt, pipeline_program):
    """|x - zp| = 255 against weights of -128 and 127: the largest int16 products and pair sums."""
    gen = torch.Generator().manual_seed(7)
    c = 19
    pick = torch.rand(2, c, 23, 29, generator=gen) < 0.5
    x = torch.where(pick, -128, 127).to(torch.int8)
    w = torch.where(torch.rand(c, 1, 3, 3, generator=gen) < 0.5, -128, 127).to(torch.int8)
    for zp, s in ((127, 1), (-128, 2)):
        args = dict(xs=0.02, xzp=zp, w=w, ws=torch.full((c,), 1e-3), b=None, stride=[s, s],
                    padding=[1, 1], dilation=[1, 1], groups=c, os=0.1, ozp=0, lo=-128,
                    hi=127)  # fmt: skip
        run_exact(rt, pipeline_program, conv_module(args), [x])


@pytest.mark.parametrize(
    "stride, padding, dilation, k",
    [([2, 1], [1, 1], [1, 1], 3), ([1, 1], [2, 2], [2, 2], 3), ([3, 3], [1, 1], [1, 1], 3),
     ([1, 1], [1, 1], [1, 1], 7), ([1, 1], [3, 0], [1, 1], 3)],
)  # fmt: skip
def test_conv2d_depthwise_other_shapes(rt, pipeline_program, stride, padding, dilation, k):
    """Shapes the planes path does not take: on channel lanes (x86) or the general path."""
    gen = torch.Generator().manual_seed(k + sum(stride) + sum(padding))
    rng = random.Random(3)
    c = 10
    args = dict(xs=0.05, xzp=3, w=i8((c, 1, k, k), gen, -127, 127), ws=weight_scales(rng, gen, c),
                b=torch.randn(c, generator=gen), stride=stride, padding=padding,
                dilation=dilation, groups=c, os=0.1, ozp=2, lo=-128, hi=127)  # fmt: skip
    run_exact(rt, pipeline_program, conv_module(args), [i8((1, c, 15, 17), gen)])


# ---- linear ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_linear_randomized(rt, pipeline_program, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    k, o = rng.choice([1, 7, 32, 129]), rng.choice([1, 5, 16, 70])
    lead = rng.choice([[], [1], [3], [4], [37], [2, 3], [2, 20]])
    ozp, lo, hi = out_params(rng)
    xs, xzp, os_ = rng.uniform(0.01, 0.1), rng.choice([-128, 0, 9, 127]), rng.uniform(0.05, 1)
    module = Op(
        lambda m, x: Q.linear(x, xs, xzp, m.w, m.ws, m.c("b"), os_, ozp, lo, hi),
        w=i8((o, k), gen, -127, 127),
        ws=weight_scales(rng, gen, o),
        b=None if seed % 3 == 0 else torch.randn(o, generator=gen),
    )
    run_exact(rt, pipeline_program, module, [i8((*lead, k), gen)])


@pytest.mark.parametrize("seed", range(8))
def test_dynamic_linear_randomized(rt, pipeline_program, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    k, o = rng.choice([3, 16, 64]), rng.choice([2, 9, 33])
    lead = rng.choice([[1], [4], [2, 7], [40]])
    x = torch.randn((*lead, k), generator=gen) * rng.choice([0.01, 1, 30])
    if seed == 1:
        x = x.abs()  # lo = 0
    elif seed == 2:
        x = -x.abs()  # hi = 0
    elif seed == 3:
        x = torch.zeros_like(x)  # scale = eps
    module = Op(
        lambda m, x: Q.dynamic_linear(x, m.w, m.ws, m.c("b")),
        w=i8((o, k), gen, -127, 127),
        ws=weight_scales(rng, gen, o),
        b=None if seed % 2 else torch.randn(o, generator=gen),
    )
    run_exact(rt, pipeline_program, module, [x])


def test_weights_are_prepared_at_load_only_where_the_kernel_packs_them(rt, pipeline_program):
    """Convolutions through the GEMM and linear layers pack their constant weights once, at
    load: more memory than the int8 weights themselves (widened to int16, or with AVX512-VNNI
    kept as bytes beside a correction per row); a depthwise convolution (its direct kernel
    reads the weights as stored) and prepare=False take none."""
    gen = torch.Generator().manual_seed(5)
    rng = random.Random(5)
    conv = dict(xs=0.04, xzp=-9, w=i8((24, 16, 3, 3), gen, -127, 127),
                ws=weight_scales(rng, gen, 24), b=torch.randn(24, generator=gen),
                stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, os=0.8, ozp=4,
                lo=-128, hi=127)  # fmt: skip
    depthwise = dict(conv, w=i8((16, 1, 3, 3), gen, -127, 127), ws=weight_scales(rng, gen, 16),
                     b=torch.randn(16, generator=gen), groups=16)  # fmt: skip
    x = i8((1, 16, 12, 12), gen)
    pte = str(pipeline_program(conv_module(conv), [x]))
    assert rt.load(pte).prepared_bytes() > 24 * 16 * 9
    assert rt.load(pte, prepare=False).prepared_bytes() == 0
    assert rt.load(str(pipeline_program(conv_module(depthwise), [x]))).prepared_bytes() == 0
    linear = Op(
        lambda m, x: Q.linear(x, 0.05, 3, m.w, m.ws, None, 0.4, 0, -128, 127),
        w=i8((40, 64), gen, -127, 127),
        ws=weight_scales(rng, gen, 40),
    )
    pte = str(pipeline_program(linear, [i8((8, 64), gen)]))
    assert rt.load(pte).prepared_bytes() > 40 * 64


def test_prepared_linear_with_a_dynamic_batch_is_exact_at_every_size(rt, tmp_path):
    """A batch-dynamic linear layer is prepared for its bound (16 rows: packed weights) and
    runs exactly at every batch size, including the few rows that take the dot products."""
    from rt_helpers import build_with_pipeline

    rng = random.Random(11)
    gen = torch.Generator().manual_seed(11)

    class Linear(Op):  # forward's argument named as the config's input, for its dynamic dim
        def forward(self, features):
            return Q.linear(features, 0.03, -7, self.w, self.ws, self.b, 0.3, 2, -128, 127)

    module = Linear(
        None,
        w=i8((33, 64), gen, -127, 127),
        ws=weight_scales(rng, gen, 33),
        b=torch.randn(33, generator=gen),
    ).eval()
    # The mlp config's input: `features` [4, 64], dim 0 dynamic in [1, 16].
    pte = build_with_pipeline(module, [i8((4, 64), gen)], tmp_path / "run", overrides=())
    prepared, unprepared = rt.load(str(pte)), rt.load(str(pte), prepare=False)
    assert prepared.prepared_bytes() > 0
    for batch in (1, 3, 4, 5, 16):
        x = i8((batch, 64), gen)
        with torch.no_grad():
            want = module(x)
        assert_exact(prepared.run([x])[0], want)
        assert_exact(unprepared.run([x])[0], want)


# ---- add, mean, max_pool2d, quantize, dequantize --------------------------------------------


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("name", ["add", "mul"])
def test_add_mul_broadcast(rt, pipeline_program, seed, name):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    nd = rng.randint(1, 4)
    a = [rng.choice([1, 2, 3, 5, 7]) for _ in range(nd)]
    b = [s if rng.random() < 0.6 else 1 for s in a]
    if rng.random() < 0.3:
        b = b[rng.randint(0, nd - 1) :]
    if seed % 2:
        a, b = b, a
    ozp, lo, hi = out_params(rng)
    p = [rng.uniform(0.01, 0.2), rng.choice([-128, 0, 127]), rng.uniform(0.01, 0.2),
         rng.choice([-128, 3, 127]), rng.uniform(0.02, 0.3), ozp, lo, hi]  # fmt: skip
    if name == "mul":  # products of order one: the output scale follows the inputs'
        p[4] = p[0] * p[2] * 128 * rng.uniform(0.3, 1.5)
    op = getattr(Q, name)
    module = Op(lambda m, x, y: op(x, p[0], p[1], y, p[2], p[3], p[4], p[5], p[6], p[7]))
    run_exact(rt, pipeline_program, module, [i8(a, gen), i8(b, gen)])


@pytest.mark.parametrize("gate_first", [False, True])
def test_mul_by_a_gate_per_channel(rt, pipeline_program, gate_first):
    """Squeeze-and-excite: [N, C, H, W] times [N, C, 1, 1], rows of 8 lanes and a tail, with
    the broadcast operand on either side."""
    gen = torch.Generator().manual_seed(9)
    x, gate = i8((2, 6, 5, 21), gen), i8((2, 6, 1, 1), gen)
    module = Op(lambda m, a, b: Q.mul(a, 0.04, 3, b, 0.008, -128, 0.05, 1, -128, 127))
    run_exact(rt, pipeline_program, module, [gate, x] if gate_first else [x, gate])


@pytest.mark.parametrize("name, out_scale", [("add", 0.09), ("mul", 0.2)])
def test_add_mul_same_shape_rows_of_vectors_and_a_tail(rt, pipeline_program, name, out_scale):
    """Contiguous operands: 8 lanes at a time, then the last 3 elements one by one."""
    gen = torch.Generator().manual_seed(5)
    op = getattr(Q, name)
    module = Op(lambda m, x, y: op(x, 0.07, -5, y, 0.03, 11, out_scale, -3, -100, 120))
    run_exact(rt, pipeline_program, module, [i8((4, 83), gen), i8((4, 83), gen)])


@pytest.mark.parametrize(
    "shape,dims,keepdim",
    [
        ((2, 5, 7, 3), [2, 3], True),
        ((2, 5, 7, 3), [2, 3], False),
        ((1, 64, 7, 7), [-1, -2], True),
        ((3, 4, 5), [1], False),
        ((3, 4, 5), [0, 2], True),
        ((6, 1, 9), [0], False),
        ((5,), [0], True),
    ],
)
def test_mean(rt, pipeline_program, shape, dims, keepdim):
    gen = torch.Generator().manual_seed(len(shape) + len(dims))
    for xzp, os_ in ((-128, 0.05), (17, 0.011), (127, 0.3)):
        module = Op(lambda m, x, xzp=xzp, os_=os_: Q.mean(x, 0.07, xzp, dims, keepdim, os_, -5))
        run_exact(rt, pipeline_program, module, [i8(shape, gen)])


@pytest.mark.parametrize(
    "shape,kernel,stride,padding,dilation,ceil",
    [
        ((1, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
        ((2, 4, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1], False),
        ((2, 4, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1], True),
        ((1, 2, 10, 7), [3, 2], [1, 2], [0, 1], [2, 1], True),
        ((3, 7, 7), [2, 2], [], [0, 0], [1, 1], False),
        # rows wider than one vector, and than one 1024-byte pass of the kernel
        ((1, 3, 21, 75), [3, 3], [2, 2], [1, 1], [1, 1], False),
        ((1, 2, 5, 1500), [3, 3], [1, 1], [1, 1], [1, 1], False),
        ((1, 2, 6, 1501), [2, 5], [2, 3], [1, 2], [1, 2], True),
        ((1, 1, 3, 70), [1, 1], [1, 2], [0, 0], [1, 1], False),
    ],
)
def test_max_pool2d(rt, pipeline_program, shape, kernel, stride, padding, dilation, ceil):
    gen = torch.Generator().manual_seed(len(shape))
    module = Op(lambda m, x: Q.max_pool2d(x, kernel, stride, padding, dilation, ceil))
    run_exact(rt, pipeline_program, module, [i8(shape, gen)])


# ---- avg_pool2d ------------------------------------------------------------------------------


def avg_pool_case(seed: int) -> tuple[list, torch.Tensor]:
    """avg_pool2d's arguments and an input: odd sizes, 3-d and 4-d inputs, strides (the
    kernel's when empty), padding up to half the kernel, both ceil modes, padding counted or
    not, and a divisor override (negative too) in every third case."""
    rng = random.Random(3000 + seed)
    gen = torch.Generator().manual_seed(3000 + seed)
    kh, kw = rng.choice([(1, 1), (2, 2), (3, 3), (2, 3), (3, 1), (5, 4), (7, 7), (4, 6)])
    stride = rng.choice([[], [1, 1], [2, 2], [1, 2], [3, 2], [2]])
    padding = [rng.randint(0, kh // 2), rng.randint(0, kw // 2)]
    if padding[0] == padding[1] and rng.random() < 0.5:
        padding = padding[:1]
    ceil_mode, count_include_pad = bool(seed % 2), bool(seed // 2 % 2)
    divisor = [1, 3, -2, 9, 1000][seed // 3 % 5] if seed % 3 == 2 else None
    c = rng.choice([1, 3, 8, 17])
    h, w = kh + rng.choice([0, 1, 4, 9]), kw + rng.choice([0, 2, 5, 13, 40])
    shape = (c, h, w) if seed % 5 == 0 else (rng.choice([1, 2]), c, h, w)
    x = i8(shape, gen)
    xs, xzp = rng.uniform(0.01, 0.1), rng.choice([-128, -7, 0, 12, 127])
    # The output's scale and zero point follow the averages' range (sums for a small divisor
    # override), so that few outputs saturate.
    gain = kh * kw / divisor if divisor else 1
    os_ = xs * rng.uniform(0.4, 1.5) * abs(gain)
    center = (x.float().mean().item() - xzp) * xs * gain / os_
    ozp = max(-128, min(127, round(-center) + rng.randint(-20, 20)))
    args = [xs, xzp, [kh, kw], stride, padding, ceil_mode, count_include_pad, divisor, os_, ozp]
    return args, x


def avg_pool_module(args: list) -> Op:
    return Op(lambda m, x: Q.avg_pool2d(x, *args))


@pytest.mark.parametrize("seed", range(24))
def test_avg_pool2d_randomized(rt, pipeline_program, seed):
    args, x = avg_pool_case(seed)
    run_exact(rt, pipeline_program, avg_pool_module(args), [x])


@pytest.mark.parametrize(
    "shape, kernel, stride, padding, ceil, count_pad, divisor",
    [
        # rows wider than one pass of column sums (512), and windows wider than one pass
        ((1, 2, 5, 1300), [3, 3], [1, 1], [1, 1], False, True, None),
        ((1, 2, 6, 1301), [2, 5], [2, 3], [1, 2], True, False, None),
        ((1, 1, 3, 1100), [2, 520], [1, 7], [0, 0], False, True, None),
        ((1, 1, 3, 1100), [3, 500], [2, 1], [1, 0], True, False, 7),
        # a global pool, and the last window of ceil_mode starting in the padding's reach
        ((2, 5, 7, 7), [7, 7], [1, 1], [0, 0], False, True, None),
        ((1, 3, 4, 4), [3, 3], [2, 2], [1, 1], True, False, None),
        ((1, 3, 4, 4), [3, 3], [2, 2], [1, 1], True, True, None),
        # extreme values: sums of 255 per tap
        ((1, 4, 9, 9), [5, 5], [2, 2], [2, 2], False, True, 1),
    ],
)
def test_avg_pool2d_paths(rt, pipeline_program, shape, kernel, stride, padding, ceil, count_pad,
                          divisor):  # fmt: skip
    gen = torch.Generator().manual_seed(len(shape) + sum(kernel))
    x = i8(shape, gen)
    if divisor == 1:
        x = torch.where(torch.rand(shape, generator=gen) < 0.5, -128, 127).to(torch.int8)
    for xzp, os_ in ((-128, 0.05), (17, 0.011), (127, 0.3)):
        os_ *= kernel[0] * kernel[1] if divisor == 1 else 1  # sums: a wider output range
        args = [0.07, xzp, kernel, stride, padding, ceil, count_pad, divisor, os_, -5]
        run_exact(rt, pipeline_program, avg_pool_module(args), [x])


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("seed", [1, 6, 11])
def test_avg_pool2d_split_over_threads_is_exact(rt, pipeline_program, seed, threads):
    args, x = avg_pool_case(seed)
    run_exact(rt, pipeline_program, avg_pool_module(args), [x], threads)


@pytest.mark.parametrize(
    "kernel, padding, ceil, count_pad, want",
    [
        ([1, 2], [0, 0], False, True, [0, 2, 4]),  # 0.5, 2.5, 4.5: half to even
        ([1, 3], [0, 1], True, False, [0, 3, 5]),  # (0+1)/2, (2+3+4)/3, 5/1
        ([1, 3], [0, 1], True, True, [0, 3, 2]),  # (0+1)/3, 9/3, 5/2: clipped to the padding
    ],
)
def test_avg_pool2d_divides_and_rounds_like_torch(rt, pipeline_program, kernel, padding, ceil,
                                                  count_pad, want):  # fmt: skip
    """Exact integer sums, then float32 (sum x scale) / divisor, rounded half to even; the
    divisor counts the padding or not, and never past the padded input."""
    x = torch.tensor([[[[0, 1, 2, 3, 4, 5]]]], dtype=torch.int8)
    module = avg_pool_module([1.0, 0, kernel, kernel, padding, ceil, count_pad, None, 1.0, 0])
    assert module(x).flatten().tolist() == want
    run_exact(rt, pipeline_program, module, [x])


# ---- amax --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,dims,keepdim",
    [
        ((1, 32, 26), [-1], False),  # a max over time: contiguous runs
        ((2, 5, 7, 3), [2, 3], True),
        ((1, 64, 130), [2], False),  # runs longer than a vector
        ((3, 4, 5), [1], False),  # rows of outputs
        ((4, 40, 70), [1], True),  # rows longer than a vector
        ((3, 4, 5), [0, 2], True),  # reduced dims apart: groups of runs
        ((2, 3, 4, 5), [0, 2], False),  # groups of rows
        ((2, 3, 100), [0, 2], False),
        ((6, 1, 9), [0], False),
        ((2, 1, 4), [1], False),  # only a dim of size 1: a copy
        ((5,), [0], True),
        ((2, 3, 4, 5), [], False),  # no dims: every dim
        ((2, 3, 4, 5), [-4, -3, -2, -1], True),
    ],
)
def test_amax(rt, pipeline_program, shape, dims, keepdim):
    gen = torch.Generator().manual_seed(len(shape) + len(dims))
    x = i8(shape, gen)
    run_exact(rt, pipeline_program, Op(lambda m, x: Q.amax(x, dims, keepdim)), [x])
    low = i8(shape, gen, -128, -120)  # every value near the bottom: -128 must win nowhere
    run_exact(rt, pipeline_program, Op(lambda m, x: Q.amax(x, dims, keepdim)), [low], threads=3)


@pytest.mark.parametrize("zp,qmin,qmax", [(0, -128, 127), (-128, -128, 127), (127, -128, 127),
                                          (3, -127, 127), (-20, -20, 127)])  # fmt: skip
def test_quantize_dequantize(rt, pipeline_program, zp, qmin, qmax):
    gen = torch.Generator().manual_seed(zp & 0xFF)
    scale = 0.037
    x = torch.randn(3, 50, generator=gen) * 3
    x[0, :20] = (torch.arange(20) - 10 + 0.5) * scale  # ties (up to float rounding)
    x[1, :6] = torch.tensor([1e9, -1e9, 0.0, -0.0, float("inf"), float("-inf")])
    run_exact(rt, pipeline_program, Op(lambda m, x: Q.quantize_per_tensor(x, scale, zp, qmin,
                                                                          qmax)), [x])  # fmt: skip
    q = i8((4, 33), gen)
    run_exact(rt, pipeline_program, Op(lambda m, q: Q.dequantize_per_tensor(q, scale, zp)), [q])


@pytest.mark.parametrize("zp", [1 << 23, -(1 << 23)])
def test_quantize_with_the_largest_zero_points(rt, pipeline_program, zp):
    """The vector paths clamp to [lo - zp, hi - zp] before rounding: with |zp| = 2^23 (the most
    make_out_quant takes) those bounds, and the ties just inside 2^23, must still give the
    reference's bits."""
    k = torch.arange(-140, 141, dtype=torch.float32)
    x = torch.cat([-zp + k, -zp + k + 0.5]).reshape(2, -1)  # +0.5: exact where |x| < 2^23
    run_exact(rt, pipeline_program, Op(lambda m, x: Q.quantize_per_tensor(x, 1.0, zp, -128, 127)),
              [x])  # fmt: skip


def test_zero_point_beyond_2_to_the_23_is_an_error(rt, pipeline_program):
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    module = Op(lambda m, x: Q.quantize_per_tensor(x, 1.0, (1 << 23) + 1, -128, 127))
    prog = rt.load(str(pipeline_program(module, [x])))
    with pytest.raises(rt.Error, match=r"output zero point 8388609 is out of range"):
        prog.run([x])


@pytest.mark.parametrize("shape", [(1,), (3, 5), (2, 8, 9, 7)])
def test_table_lookup(rt, pipeline_program, shape):
    gen = torch.Generator().manual_seed(len(shape))
    module = Op(lambda m, x: Q.table_lookup(x, m.t), t=i8((256,), gen))
    x = i8(shape, gen)
    every = torch.arange(-128, 128, dtype=torch.int8)  # every entry, where there is room
    x.view(-1)[: min(256, x.numel())] = every[: x.numel()]
    run_exact(rt, pipeline_program, module, [x], threads=2)


def test_int8_permute_and_view(rt, pipeline_program):
    """Shape ops on int8 tensors (Char in portable.yaml's view_copy / permute_copy)."""
    gen = torch.Generator().manual_seed(0)
    module = Op(lambda m, q: Q.add(q.permute(0, 2, 1).reshape(6, 4), 0.1, 0, q.reshape(6, 4),
                                   0.1, 0, 0.2, 0, -128, 127))  # fmt: skip
    run_exact(rt, pipeline_program, module, [i8((2, 3, 4), gen)])


# ---- errors a program can trigger ------------------------------------------------------------


def test_bad_zero_point_is_an_error_not_a_crash(rt, pipeline_program):
    gen = torch.Generator().manual_seed(0)
    module = Op(lambda m, x: Q.add(x, 0.1, 300, x, 0.1, 0, 0.2, 0, -128, 127))
    prog = rt.load(str(pipeline_program(module, [i8((2, 3), gen)])))
    with pytest.raises(rt.Error, match=r"etb_quantized::add: self zero point 300 is outside"):
        prog.run([i8((2, 3), gen)])


def test_bad_clamp_bounds_are_an_error(rt, pipeline_program):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, generator=gen)
    module = Op(lambda m, x: Q.quantize_per_tensor(x, 0.1, 0, 10, -10))
    prog = rt.load(str(pipeline_program(module, [x])))
    with pytest.raises(rt.Error, match=r"output clamp \[10, -10\] must lie within"):
        prog.run([x])


def test_avg_pool2d_zero_divisor_is_an_error(rt, pipeline_program):
    gen = torch.Generator().manual_seed(0)
    module = avg_pool_module([0.1, 0, [2, 2], [], [0, 0], False, True, 0, 0.1, 0])
    prog = rt.load(str(pipeline_program(module, [i8((1, 2, 4, 4), gen)])))
    with pytest.raises(rt.Error, match=r"etb_quantized::avg_pool2d: divisor_override must be"):
        prog.run([i8((1, 2, 4, 4), gen)])
