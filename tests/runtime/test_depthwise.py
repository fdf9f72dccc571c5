"""fp32 depthwise convolution (kernels/portable/depthwise.cpp) against torch on randomized shapes.

The kernel runs on planes, one channel at a time, with a templated path (3x3 and 5x5, stride 1 or 2,
no dilation), a path over a table of tap offsets (dilation, other kernel sizes and strides, 1-d
convolutions), two ways of covering a plane (by rows, in blocks along wide rows or across narrow
ones; or over the flat padded plane, for planes a few outputs wide) and a plain loop for planes too
large for its scratch; or, for strided convolutions and small planes, on channel lanes (a vector's
lanes are channels). The cases below reach all of them: odd sizes from 1 to 112 (row ends, vectors
that spill into the next row, the plane's last vectors), paddings 0 to 2, channel multiplier 2,
batch 2, with and without bias, and a following ReLU6 / ReLU / Hardtanh that Method load fuses into
the kernel (NaN must survive the fused clamp, as in torch).

Each program holds many cases (one input and one output per case), so few programs are built.
"""

from __future__ import annotations

import random

import torch
from rt_helpers import assert_matches
from torch import nn

SEED = 1729  # the shapes are drawn once from this seed, so a failure reproduces
SIZES = [1, 2, 3, 7, 13, 17, 112]


class Branches(nn.Module):
    """One convolution (and an optional activation) per input; one output per input."""

    def __init__(self, convs: list[nn.Module], acts: list[nn.Module | None]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.acts = nn.ModuleList([a if a is not None else nn.Identity() for a in acts])

    def forward(self, *xs):
        return tuple(act(conv(x)) for conv, act, x in zip(self.convs, self.acts, xs, strict=True))


def _depthwise(rng: random.Random, c: int, k: tuple[int, int], **kw) -> nn.Conv2d:
    mult = kw.pop("mult", rng.choice([1, 1, 1, 2]))
    bias = kw.pop("bias", rng.random() < 0.7)
    conv = nn.Conv2d(c, c * mult, k, groups=c, bias=bias, **kw)
    with torch.no_grad():  # bias of the order of the sums, so that it matters
        if conv.bias is not None:
            conv.bias.normal_(0, 2)
    return conv


def _fast_cases(rng: random.Random, n: int) -> list[tuple[nn.Module, torch.Tensor]]:
    """3x3 / 5x5, stride 1 / 2, no dilation: the templated path."""
    cases = []
    while len(cases) < n:
        k = rng.choice([3, 5])
        s = rng.choice([1, 2])
        p = rng.choice([0, 1, 2])
        h, w = rng.choice(SIZES), rng.choice(SIZES)
        if h + 2 * p < k or w + 2 * p < k or (h == 112 and w == 112):
            continue
        c = rng.choice([1, 3, 5, 9, 17])
        batch = rng.choice([1, 1, 2])
        cases.append((_depthwise(rng, c, (k, k), stride=s, padding=p), torch.randn(batch, c, h, w)))
    return cases


def _general_cases(rng: random.Random, n: int) -> list[tuple[nn.Module, torch.Tensor]]:
    """Dilation, other kernel sizes, non-square kernels and strides: the tap-table path."""
    cases = []
    while len(cases) < n:
        kh, kw = rng.choice([(3, 3), (5, 5), (7, 7), (1, 3), (3, 1), (1, 5), (2, 2), (1, 1)])
        sh, sw = rng.choice([(1, 1), (2, 2), (3, 3), (1, 2), (2, 1)])
        dh, dw = rng.choice([(1, 1), (2, 2), (2, 2), (1, 2)])
        ph, pw = rng.randint(0, 2), rng.randint(0, 2)
        if (kh, kw) in ((3, 3), (5, 5)) and sh == sw and sh < 3 and (dh, dw) == (1, 1):
            dh = dw = 2  # keep these on the general path
        h, w = rng.choice(SIZES[:-1] + [40]), rng.choice(SIZES)
        if h + 2 * ph < dh * (kh - 1) + 1 or w + 2 * pw < dw * (kw - 1) + 1:
            continue
        c = rng.choice([1, 2, 5, 11])
        conv = _depthwise(rng, c, (kh, kw), stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw))
        cases.append((conv, torch.randn(rng.choice([1, 2]), c, h, w)))
    return cases


def _conv1d_cases(rng: random.Random, n: int) -> list[tuple[nn.Module, torch.Tensor]]:
    """Conv1d with groups == channels (H = 1 on the runtime side)."""
    cases = []
    while len(cases) < n:
        k = rng.choice([1, 3, 5, 9])
        s, d, p = rng.choice([1, 1, 2, 3]), rng.choice([1, 1, 2]), rng.randint(0, 4)
        length = rng.choice([1, 5, 16, 33, 100])
        if length + 2 * p < d * (k - 1) + 1:
            continue
        c, mult = rng.choice([1, 4, 7, 16]), rng.choice([1, 2])
        conv = nn.Conv1d(c, c * mult, k, s, p, d, groups=c, bias=rng.random() < 0.7)
        cases.append((conv, torch.randn(rng.choice([1, 2]), c, length)))
    return cases


def _check(rt, pipeline_program, cases, acts=None, profile_has=None, threads=1):
    convs, xs = [c for c, _ in cases], [x for _, x in cases]
    module = Branches(convs, acts or [None] * len(convs)).eval()
    with torch.no_grad():
        wants = module(*xs)
    pte = str(pipeline_program(module, xs))
    prog = rt.load(pte)
    gots = prog.run(xs, profile=profile_has is not None)
    for n in range(2, threads + 1):  # bit-identical at every thread count
        for i, got in enumerate(rt.load(pte, threads=n).run(xs)):
            assert torch.equal(got, gots[i]), f"{convs[i]} on {tuple(xs[i].shape)}, threads={n}"
    if profile_has is not None:
        names = [name for name, _ in prog.last_profile]
        assert names.count(profile_has) == len(cases), names
    assert len(gots) == len(wants)
    for (conv, x), got, want in zip(cases, gots, wants, strict=True):
        try:
            assert_matches(got, want, 1e-5)
        except AssertionError as e:
            raise AssertionError(f"{conv} on {tuple(x.shape)}: {e}") from None
    return gots


def test_fast_path(rt, pipeline_program):
    torch.manual_seed(SEED)
    _check(rt, pipeline_program, _fast_cases(random.Random(SEED), 28), threads=4)


def test_mobilenet_shapes(rt, pipeline_program):
    """Whole-width rows (112, 56, 28), small planes (14x14, 7x7) and 5x5 / stride 2."""
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    shapes = [(8, 112, 3, 1), (6, 112, 3, 2), (5, 56, 3, 1), (7, 28, 5, 2), (9, 14, 3, 1),
              (10, 14, 5, 2), (12, 7, 3, 1), (4, 7, 5, 1)]  # fmt: skip
    cases = [
        (_depthwise(rng, c, (k, k), stride=s, padding=k // 2, mult=1), torch.randn(1, c, h, h))
        for c, h, k, s in shapes
    ]
    _check(rt, pipeline_program, cases)


def test_channel_lanes(rt, pipeline_program):
    """Strided convolutions and small planes run on channel lanes (depthwise_lanes.cpp): blocks
    of a vector width of channels, whole and partial (1 to 24 channels, multiplier 1 to 3);
    output rows narrower than a segment of pixels, as wide as one, and wider (segments that
    overlap at the row's end); planes of fewer outputs than a vector (the last transpose back
    stores part of each channel); kernels of fewer taps than a vector (1x2) and of more (7x7);
    stride 3 and dilation 2 (tap offsets worked out at run time); the last channel of the
    tensor read only as far as its end; and, at 2 and 3 threads, channel runs cut to whole
    blocks."""
    torch.manual_seed(SEED + 70)
    rng = random.Random(SEED + 70)
    # (C, mult, H, W, kernel, stride, padding, dilation)
    shapes = [(8, 1, 7, 7, 3, 1, 1, 1), (16, 1, 14, 14, 3, 2, 1, 1), (24, 1, 9, 20, 3, 1, 1, 1),
              (5, 3, 6, 5, 3, 1, 1, 1), (13, 2, 15, 17, 5, 2, 2, 1), (1, 1, 3, 3, 3, 1, 0, 1),
              (11, 1, 2, 5, 3, 2, 1, 1), (9, 1, 12, 13, (1, 2), 1, 0, 1),
              (7, 1, 13, 11, 7, 1, 3, 1), (10, 1, 20, 22, 3, 3, 1, 1),
              (6, 2, 17, 9, 3, 2, 2, 2), (17, 1, 28, 28, 3, 2, 1, 1)]  # fmt: skip
    cases = [
        (_depthwise(rng, c, k if isinstance(k, tuple) else (k, k), stride=s, padding=p,
                    dilation=d, mult=m), torch.randn(1, c, h, w))
        for c, m, h, w, k, s, p, d in shapes
    ]  # fmt: skip
    acts = [nn.ReLU6() if i % 3 == 0 else None for i in range(len(cases))]
    _check(rt, pipeline_program, cases, acts, threads=3)


def test_threads_split_channels_bit_identically(rt, pipeline_program):
    """At 2 to 4 threads each thread takes a band of rows, in runs of channels, with its own
    scratch: the templated, tap-table and plain paths, strides 1 to 3, batch 2, a fused clamp.
    Every output is bit-identical to one thread's."""
    torch.manual_seed(SEED + 60)
    rng = random.Random(SEED + 60)
    shapes = [(6, 112, 3, 1, 1), (5, 57, 3, 2, 1), (4, 33, 5, 1, 1), (3, 40, 5, 2, 2),
              (7, 14, 3, 1, 1), (2, 35, 3, 3, 1)]  # (C, H, k, stride, batch)  # fmt: skip
    cases = [
        (_depthwise(rng, c, (k, k), stride=s, padding=k // 2), torch.randn(n, c, h, h + 3))
        for c, h, k, s, n in shapes
    ]
    cases.append((_depthwise(rng, 3, (3, 3), padding=1, dilation=2), torch.randn(1, 3, 41, 20)))
    cases.append((_depthwise(rng, 2, (3, 3), padding=1, mult=1), torch.randn(1, 2, 725, 731)))
    acts = [nn.ReLU6() if i % 2 else None for i in range(len(cases))]
    _check(rt, pipeline_program, cases, acts, threads=4)


def test_bands_of_rows(rt, pipeline_program):
    """The bands' edges at 2 to 4 threads: the first band's padding above, the last one's
    below (all of it, the band starting inside the plane), bands of 2 rows, strides whose band
    starts fall between input rows, dilation, a channel multiplier, planes on lanes (14x14) and
    on planes, and a plane whose last band would read padding alone (1x1 kernel, padding 3:
    the whole plane, one band). Outputs against torch, bit-identical at every count."""
    torch.manual_seed(SEED + 80)
    rng = random.Random(SEED + 80)
    # (C, mult, H, W, kernel, stride, padding, dilation)
    shapes = [(5, 1, 8, 9, 3, 1, 1, 1), (4, 1, 9, 40, 3, 2, 1, 1), (3, 2, 23, 20, 5, 2, 2, 1),
              (6, 1, 30, 31, 3, 1, 2, 2), (3, 1, 11, 12, 5, 3, 4, 1), (16, 1, 14, 14, 3, 1, 1, 1),
              (3, 1, 2, 5, 1, 1, 3, 1), (2, 1, 57, 33, 7, 1, 3, 1)]  # fmt: skip
    cases = [
        (_depthwise(rng, c, (k, k), stride=s, padding=p, dilation=d, mult=m),
         torch.randn(1, c, h, w))
        for c, m, h, w, k, s, p, d in shapes
    ]  # fmt: skip
    acts = [nn.ReLU6() if i % 2 else None for i in range(len(cases))]
    _check(rt, pipeline_program, cases, acts, threads=4)


def test_general_path(rt, pipeline_program):
    torch.manual_seed(SEED + 10)
    _check(rt, pipeline_program, _general_cases(random.Random(SEED + 10), 14), threads=4)


def test_conv1d(rt, pipeline_program):
    torch.manual_seed(SEED + 20)
    _check(rt, pipeline_program, _conv1d_cases(random.Random(SEED + 20), 10), threads=4)


def test_planes_too_large_for_scratch(rt, pipeline_program):
    """Planes over the kernel's scratch budget (2 MiB) take the plain loop."""
    torch.manual_seed(SEED + 30)
    rng = random.Random(SEED + 30)
    cases = [
        (_depthwise(rng, 2, (3, 3), padding=1, mult=1), torch.randn(1, 2, 725, 731)),
        (nn.Conv1d(3, 3, 5, padding=2, groups=3), torch.randn(1, 3, 600_000)),
    ]
    _check(rt, pipeline_program, cases)


ACTS = {  # the activation and the bounds it clamps to
    "relu6": (nn.ReLU6, (0.0, 6.0)),
    "relu": (nn.ReLU, (0.0, None)),
    "hardtanh": (lambda: nn.Hardtanh(-0.5, 0.25), (-0.5, 0.25)),
}


def test_fused_activations(rt, pipeline_program):
    """ReLU6 / ReLU / Hardtanh after a depthwise convolution run in its epilogue: the
    activations are fused (no kernel call of their own) and every bound is hit."""
    torch.manual_seed(SEED + 40)
    rng = random.Random(SEED + 40)
    cases = _fast_cases(rng, 6) + _general_cases(rng, 3) + _conv1d_cases(rng, 3)
    names = [rng.choice(sorted(ACTS)) for _ in cases]
    for conv, _ in cases:  # outputs beyond the bounds of every activation
        with torch.no_grad():
            conv.weight.mul_(3)
    acts = [ACTS[n][0]() for n in names]
    gots = _check(rt, pipeline_program, cases, acts, profile_has="fused")
    for name in set(names):
        got = torch.cat([g.flatten() for g, n in zip(gots, names, strict=True) if n == name])
        for bound in ACTS[name][1]:
            assert bound is None or (got == bound).any(), (name, bound)


def test_nan_survives_the_fused_clamp(rt, pipeline_program):
    torch.manual_seed(SEED + 50)
    rng = random.Random(SEED + 50)
    shapes = [((3, 3), 1, 20, 37), ((5, 5), 2, 9, 9), ((3, 3), 1, 7, 7), ((1, 3), 1, 4, 50)]
    cases = [
        (_depthwise(rng, 3, k, stride=s, padding=(k[0] // 2, k[1] // 2)), torch.randn(1, 3, h, w))
        for k, s, h, w in shapes
    ]
    for _, x in cases:
        x.view(-1)[torch.randint(0, x.numel(), (2,))] = float("nan")
    module = Branches([c for c, _ in cases], [nn.ReLU6() for _ in cases]).eval()
    xs = [x for _, x in cases]
    with torch.no_grad():
        wants = module(*xs)
    gots = rt.load(str(pipeline_program(module, xs))).run(xs)
    for got, want in zip(gots, wants, strict=True):
        assert want.isnan().any()
        assert torch.equal(got.isnan(), want.isnan())
        keep = ~want.isnan()
        assert_matches(got[keep], want[keep], 1e-5)
