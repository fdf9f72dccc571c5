"""The fp32 GEMM behind linear, matmul and convolution, against torch on randomized shapes:
row counts that use the one- and two-row tiles (depth split in blocks) and the general tile
with a partial last row block, column counts with every tail width, and the epilogues
(column bias, row bias, accumulate into a scaled self, fused clamp)."""

from __future__ import annotations

import random

import pytest
import torch
from rt_helpers import assert_matches
from torch import nn


class Linear(nn.Module):
    def __init__(self, k: int, n: int, act: nn.Module | None) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n)
        self.act = act or nn.Identity()

    def forward(self, x):
        return self.act(self.fc(x))


class AddMM(nn.Module):
    def __init__(self, beta: float, alpha: float) -> None:
        super().__init__()
        self.beta, self.alpha = beta, alpha

    def forward(self, s, a, b):
        return torch.addmm(s, a, b, beta=self.beta, alpha=self.alpha)


def _check(rt, pipeline_program, module, inputs):
    module.eval()
    with torch.no_grad():
        want = module(*inputs)
    (got,) = rt.load(str(pipeline_program(module, inputs))).run(list(inputs))
    if want.numel() >= 8:  # outputs of order one that vary
        assert want.abs().max() > 0.1 and want.std() > 0.01
    assert_matches(got, want, 1e-4)


SHAPES = [  # (M, K, N): M 1 and 2 take the wide tiles with depth blocks of 64
    (1, 1, 1), (1, 200, 1000), (1, 65, 33), (2, 130, 17), (2, 7, 64),
    (3, 33, 9), (6, 16, 16), (7, 100, 47), (13, 64, 129), (33, 5, 250),
    (1, 300, 1001), (2, 90, 23), (9, 1000, 49), (17, 700, 31), (8, 3, 15),
    (12, 40, 17), (5, 600, 81),  # a whole tile and a tail vector as one wider tile (AVX-512)
    (40, 64, 256),  # B's rows 1 KiB apart (on 4 of L1's 64 sets): copied into panels
]  # fmt: skip


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_linear(rt, pipeline_program, m, k, n, act):
    torch.manual_seed(m * 1000 + k * 10 + n)
    acts = {None: None, "relu": nn.ReLU(), "relu6": nn.ReLU6()}
    module = Linear(k, n, acts[act])
    with torch.no_grad():  # weights of order one, so outputs are too
        module.fc.weight.normal_(0, k**-0.5 * 2)
        module.fc.bias.normal_(0, 1)
    _check(rt, pipeline_program, module, [torch.randn(m, k)])


@pytest.mark.parametrize(
    "beta,alpha", [(1.0, 1.0), (0.5, 1.0), (0.0, 1.0), (1.0, 0.5), (2.0, -1.5)]
)
@pytest.mark.parametrize("bias_shape", ["row", "full", "column"])
def test_addmm_epilogues(rt, pipeline_program, beta, alpha, bias_shape):
    rng = random.Random(hash((beta, alpha, bias_shape)) & 0xFFFF)
    m, k, n = rng.randint(1, 20), rng.randint(1, 90), rng.randint(1, 70)
    shape = {"row": (n,), "full": (m, n), "column": (m, 1)}[bias_shape]
    torch.manual_seed(rng.randint(0, 1 << 30))
    inputs = [torch.randn(shape), torch.randn(m, k), torch.randn(k, n)]
    _check(rt, pipeline_program, AddMM(beta, alpha), inputs)


@pytest.mark.parametrize("seed", range(6))
def test_matmul_random(rt, pipeline_program, seed):
    rng = random.Random(seed)
    b, m, k, n = rng.randint(1, 3), rng.randint(1, 40), rng.randint(1, 300), rng.randint(1, 90)
    torch.manual_seed(seed)

    class MatMul(nn.Module):
        def forward(self, x, y):
            return x @ y

    _check(rt, pipeline_program, MatMul(), [torch.randn(b, m, k), torch.randn(b, k, n)])
    _check(rt, pipeline_program, MatMul(), [torch.randn(m, k), torch.randn(k, n)])


@pytest.mark.parametrize("seed", range(8))
def test_pointwise_and_im2col_convolutions(rt, pipeline_program, seed):
    rng = random.Random(100 + seed)
    groups = rng.choice([1, 1, 2, 3])
    cin = groups * rng.randint(1, 13)
    cout = groups * rng.randint(1, 21)
    k = rng.choice([1, 1, 3, 5])
    stride = rng.choice([1, 2]) if k > 1 else 1
    pad = rng.randint(0, k // 2)
    conv = nn.Conv2d(
        cin,
        cout,
        k,
        stride,
        pad,
        dilation=rng.choice([1, 2]) if k == 3 else 1,
        groups=groups,
        bias=rng.random() < 0.7,
    )
    module = nn.Sequential(conv, nn.ReLU6()) if rng.random() < 0.5 else conv
    torch.manual_seed(seed)
    x = torch.randn(rng.randint(1, 2), cin, rng.randint(5, 30), rng.randint(5, 30))
    _check(rt, pipeline_program, module, [x])


@pytest.mark.parametrize(
    "n,cin,cout,hw,k,pad,dilation,groups",
    [
        (1, 16, 24, (20, 22), 3, (1, 1), 1, 1),  # 3x3, padded: Wq = W + 2
        (2, 12, 10, (32, 32), 3, (1, 2), 2, 2),  # dilation 2, uneven padding, groups, 2 images
        (1, 8, 40, (30, 30), 5, (2, 2), 1, 1),  # 5x5: 81 output columns of 34 a row used
        (1, 6, 5, (1, 200), (1, 3), (0, 1), 1, 1),  # one row (a 1-d convolution's shape)
    ],
)
def test_stride_1_convolutions_read_the_input_in_place(
    rt, pipeline_program, n, cin, cout, hw, k, pad, dilation, groups
):
    """Stride-1 convolutions on planes big enough for the taps path (hosted): the GEMM reads
    its rows from a padded copy of the input, the output rows come out of a wider product."""
    torch.manual_seed(cin * cout + hw[1])
    conv = nn.Conv2d(cin, cout, k, 1, pad, dilation=dilation, groups=groups)
    _check(rt, pipeline_program, nn.Sequential(conv, nn.ReLU6()), [torch.randn(n, cin, *hw)])


def _check_over_threads(rt, pipeline_program, conv, x, thread_counts) -> None:
    """conv + ReLU6 at one thread against torch (its outputs of order one, varying), then
    bit-identical to that at each of `thread_counts`."""
    module = nn.Sequential(conv, nn.ReLU6()).eval()
    with torch.no_grad():
        want = module(x)
    assert want.abs().max() > 0.1 and want.std() > 0.01
    pte = str(pipeline_program(module, [x]))
    (one,) = rt.load(pte).run([x])
    assert_matches(one, want, 1e-4)
    for threads in thread_counts:
        (got,) = rt.load(pte, threads=threads).run([x])
        assert torch.equal(got, one), f"threads={threads} differs from one thread"


@pytest.mark.parametrize(
    "cin,cout,hw,groups",
    [
        # weights bigger than the layout: chunks of channels (whole row tiles; 13 tiles of 8
        # rows on AVX-512, 17 of 6 on AVX2), at 4 threads then 2 runs of columns
        (32, 100, (14, 14), 1),
        (48, 40, (14, 14), 1),  # 5 row tiles (AVX-512) or 7 (AVX2): at 2 threads, 2 runs too
        (24, 50, (12, 13), 2),  # groups, and a last chunk shorter than the others
        # a layout bigger than the weights: runs of columns; at one thread, two depth blocks
        # of 32 planes and two blocks of columns (1536 + 144)
        (64, 12, (40, 40), 1),
    ],
)
def test_stride_1_convolutions_split_over_threads(rt, pipeline_program, cin, cout, hw, groups):
    """The taps path splits a convolution over the threads by chunks of output channels where
    the weights outweigh the input's layout (deep layers on small planes; then each thread
    fills a copy of the layout of its own), else by runs of columns. Exact against torch, and
    bit-identical at 2 to 4 threads."""
    torch.manual_seed(cin * cout)
    conv = nn.Conv2d(cin, cout, 3, 1, 1, groups=groups)
    _check_over_threads(rt, pipeline_program, conv, torch.randn(1, cin, *hw), (2, 3, 4))


@pytest.mark.parametrize(
    "cin,cout,hw,k,stride",
    [
        (16, 24, (121, 99), 3, 2),  # 3050 columns of depth 144 (1.8 MB): tiles, the last partial
        (3, 10, (150, 130), 7, 2),  # an RGB stem, 7x7: 4875 columns of depth 147
        (96, 40, (13, 13), 3, 2),  # 49 columns of depth 864 (169 KB): one tile
        # 196 columns (rows 208 apart) of depth 576: one tile, two depth and two column blocks
        (64, 40, (27, 27), 3, 2),
    ],
)
def test_im2col_convolutions_in_column_tiles_and_whole(
    rt, pipeline_program, cin, cout, hw, k, stride
):
    """Stride-2 convolutions go through im2col: a plane whose columns take more than 1 MB in
    column tiles (each thread packing and multiplying its own), a smaller one as one tile (at
    threads, its packing split by channels and its product by rows). A tile's rows lie a whole
    number of cache lines apart, whatever its width. Exact against torch, and bit-identical at
    1, 2 and 3 threads."""
    torch.manual_seed(cin * cout)
    conv = nn.Conv2d(cin, cout, k, stride, k // 2)
    _check_over_threads(rt, pipeline_program, conv, torch.randn(1, cin, *hw), (2, 3))


@pytest.mark.parametrize(
    "cin,cout,h,w",
    [
        (960, 136, 7, 7),  # depth in two blocks; 17 row tiles or more: B copied into panels
        (160, 13, 7, 7),
        (40, 9, 14, 14),
        (64, 40, 5, 5),  # 25 columns: a whole tile, a narrower one (AVX2) and a dot column
        (256, 136, 15, 17),  # 255 columns of depth 256: two column blocks, each its panels
        # 784 columns in two blocks, the second ending in a whole tile and a tail that merge
        # (AVX-512): with threads, runs of columns keep the two together
        (96, 16, 28, 28),
        # planes whose rows of B lie 4 or 16 KiB apart, on one set of L1: copied into panels
        (128, 40, 32, 32),
        (64, 48, 16, 64),
        (48, 64, 64, 64),  # a plane of at least 56x56: with threads, panels and not column runs
    ],
)
def test_pointwise_convolution_on_small_planes(rt, pipeline_program, cin, cout, h, w):
    """Planes whose column count ends in a partial tile (25, 49, 196, 255 columns): the last
    columns go as narrower tiles and dot products, with the depth split in blocks for 960
    channels (the later blocks add to the output, the clamp waits for the last). Rows of B
    off the vector boundary or a multiple of 1 KiB apart, read by four row tiles or more, are
    first copied into panels, a slice at a time. Exact against torch, and bit-identical at 2
    and 3 threads."""
    torch.manual_seed(cin + cout)
    conv = nn.Conv2d(cin, cout, 1)
    with torch.no_grad():
        conv.weight.normal_(0, cin**-0.5 * 2)
    _check_over_threads(rt, pipeline_program, conv, torch.randn(1, cin, h, w), (2, 3))


@pytest.mark.parametrize(
    "cin,cout,h,w,groups,batch",
    [
        (576, 96, 14, 14, 1, 1),  # MobileNetV2's projection: halves of 288, B into panels
        (129, 13, 7, 9, 1, 1),  # odd depth (halves of 64 and 65), a partial row tile, tails
        (1100, 40, 5, 5, 1, 1),  # halves of 550: each in two depth blocks
        (256, 64, 6, 11, 2, 2),  # per group (128 channels each) and per batch item
        (200, 128, 3, 3, 1, 1),  # the most rows that take halves; 9 columns: dot products
        (130, 128, 32, 33, 1, 1),  # 528 KB of output: the plain product
    ],
)
def test_pointwise_convolution_in_depth_halves(
    rt, pipeline_program, cin, cout, h, w, groups, batch
):
    """A 1x1 convolution with at most 128 output channels over 128 input channels or more
    (per group), whose output is at most 512 KB, is the sum of two products, one per half of
    the input channels (each thread then reads the channels its core's cache holds), the clamp
    after the sum. Exact against torch, and bit-identical at 2, 3 and 4 threads (at 4, each
    half in two runs of rows)."""
    torch.manual_seed(cin + cout + h)
    conv = nn.Conv2d(cin, cout, 1, groups=groups)
    with torch.no_grad():
        conv.weight.normal_(0, (cin // groups) ** -0.5 * 2)
    _check_over_threads(rt, pipeline_program, conv, torch.randn(batch, cin, h, w), (2, 3, 4))
