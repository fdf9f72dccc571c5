"""etb::expand_depthwise_project and etb::depthwise_project: a Float MobileNet block (pointwise
expansion, depthwise convolution, pointwise projection; or the last two) in one kernel call, a
band of rows at a time. Its output must match the reference (three conv2d with their clamps)
as a convolution does, and be the same bits at every thread count, whatever the bands."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from etbuild.pipeline import blocks

B = blocks.ops


def block_case(seed: int, n, c, h, w, e, o, k, stride, pad) -> dict:
    """A block's input, weights and clamps: ReLU6 after the expansion (or no clamp), ReLU or
    hardtanh-like bounds after the depthwise convolution, each stage's values of order one."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, fan_in=1):
        return torch.randn(*shape, generator=gen) / math.sqrt(fan_in)

    a = dict(x=randn(n, c, h, w))
    a["we"], a["wd"], a["wp"] = randn(e, c, 1, 1, fan_in=c), randn(e, 1, k, k, fan_in=k * k / 2), \
        randn(o, e, 1, 1, fan_in=e / 2)  # fmt: skip
    a["be"] = None if rng.random() < 0.3 else randn(e) * 0.5
    a["bd"] = None if rng.random() < 0.3 else randn(e) * 0.5
    a["bp"] = None if rng.random() < 0.5 else randn(o)
    a["ebounds"] = rng.choice([(0.0, 6.0), (-math.inf, math.inf)])
    a["dbounds"] = rng.choice([(0.0, 6.0), (0.0, math.inf), (-1.0, 1.5)])
    a["stride"], a["padding"] = [stride, stride], [pad, pad]
    return a


class Block(nn.Module):
    """Calls the fused op itself (``expand``) or the pair."""

    def __init__(self, a: dict, expand: bool = True) -> None:
        super().__init__()
        self.a, self.expand = a, expand
        for k in ("we", "be", "wd", "bd", "wp", "bp"):
            if a[k] is not None:
                self.register_buffer(k, a[k])

    def c(self, name):
        return getattr(self, name) if self.a[name] is not None else None

    def forward(self, x):
        a = self.a
        tail = (self.wd, self.c("bd"), a["stride"], a["padding"], *a["dbounds"], self.wp,
                self.c("bp"))  # fmt: skip
        if self.expand:
            return B.expand_depthwise_project(x, self.we, self.c("be"), *a["ebounds"], *tail)
        return B.depthwise_project(x, *tail)


def check_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    # Outputs that vanish or are all alike would prove nothing.
    assert want.std() > 0.1 and len(torch.unique(want)) > want.numel() // 2, want.std()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def run_threads(rt, pte, x, threads=(1, 2, 3, 4)) -> torch.Tensor:
    """The program's output at each thread count: the same bits at every one."""
    outs = [rt.load(str(pte), threads=t).run([x])[0] for t in threads]
    for t, out in zip(threads[1:], outs[1:], strict=True):
        assert torch.equal(out, outs[0]), f"{threads[0]} and {t} threads differ"
    return outs[0]


SHAPES = [
    # n, c, h, w, e, o, k, stride, pad
    (1, 16, 112, 112, 96, 24, 3, 2, 1),  # MobileNetV2's first expanding block: many bands
    (1, 24, 56, 56, 144, 24, 3, 1, 1),  # a stride-1 block: bands share two expanded rows
    (1, 32, 28, 28, 192, 32, 3, 1, 1),  # 28-pixel rows: four rows to a whole vector (AVX-512)
    (2, 8, 23, 17, 48, 12, 3, 2, 1),  # two images, odd sizes: the last row's taps pad
    (1, 5, 19, 21, 30, 7, 5, 1, 2),  # 5x5, padding 2: two padding rows at each end
    (1, 6, 20, 13, 24, 9, 5, 2, 0),  # no padding, stride 2: a band reads rows to the end
    (1, 3, 3, 3, 8, 5, 3, 1, 2),  # a plane smaller than its padding
    (1, 32, 9, 64, 600, 16, 3, 1, 1),  # wide rows of many channels: bands of one row
]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(i) for i in range(len(SHAPES))])
def test_block_matches_three_convolutions_at_every_thread_count(rt, pipeline_program, shape):
    a = block_case(0, *shape)
    module = Block(a)
    pte = pipeline_program(module, [a["x"]])
    check_close(run_threads(rt, pte, a["x"]), module(a["x"]))


@pytest.mark.parametrize("seed", range(3))
def test_block_randomized(rt, pipeline_program, seed):
    rng = random.Random(200 + seed)
    k = rng.choice([3, 5])
    shape = (rng.choice([1, 2]), rng.choice([4, 16, 24]), rng.randint(k, 60),
             rng.randint(k, 60), rng.choice([24, 96, 144]), rng.choice([8, 24, 40]), k,
             rng.choice([1, 2]), rng.randint(0, k - 1))  # fmt: skip
    a = block_case(seed, *shape)
    module = Block(a)
    pte = pipeline_program(module, [a["x"]])
    check_close(run_threads(rt, pte, a["x"], threads=(1, 2, 3)), module(a["x"]))


@pytest.mark.parametrize("shape", SHAPES[:4], ids=[str(i) for i in range(4)])
def test_depthwise_project_matches_two_convolutions(rt, pipeline_program, shape):
    n, c, h, w, _e, o, k, stride, pad = shape
    a = block_case(1, n, c, h, w, c, o, k, stride, pad)
    module = Block(a, expand=False)
    pte = pipeline_program(module, [a["x"]])
    check_close(run_threads(rt, pte, a["x"], threads=(1, 2, 4)), module(a["x"]))


def test_bounds_the_wrong_way_round_are_an_error(rt, pipeline_program):
    a = block_case(0, 1, 4, 10, 10, 8, 4, 3, 1, 1)
    a["dbounds"] = (6.0, 0.0)
    prog = rt.load(str(pipeline_program(Block(a), [a["x"]])))
    with pytest.raises(
        rt.Error,
        match=r"etb::expand_depthwise_project: depthwise_min \(6\) must not exceed "
        r"depthwise_max \(0\)",
    ):
        prog.run([a["x"]])


# ---- the pipeline's fusion of Float convolutions (pipeline/blocks.py) -----------------------


class Chain(nn.Module):
    """A MobileNetV2 block as separate layers; ``act`` between the stages (a module class),
    ``also_expanded`` returns the expanded tensor too, ``residual`` adds the input."""

    def __init__(self, c, e, o, k=3, stride=1, act=nn.ReLU6, also_expanded=False,
                 residual=False, expand=True, dilation=1) -> None:  # fmt: skip
        super().__init__()
        torch.manual_seed(0)
        self.expand = nn.Sequential(nn.Conv2d(c, e, 1), act()) if expand else nn.Identity()
        self.depthwise = nn.Sequential(
            nn.Conv2d(e, e, k, stride, dilation * (k // 2), dilation, groups=e), act()
        )
        self.project = nn.Conv2d(e, o, 1)
        self.also_expanded, self.residual = also_expanded, residual

    def forward(self, x):
        ex = self.expand(x)
        y = self.project(self.depthwise(ex))
        if self.residual:
            y = y + x
        return (y, ex) if self.also_expanded else y


def kernels_run(rt, pte, x) -> list[str]:
    prog = rt.load(str(pte))
    prog.run([x], profile=True)
    return [name for name, _ in prog.last_profile]


FUSE = ["model.dynamic_dims=[]", "pipeline.lower.fuse_float_blocks=true"]


def test_pipeline_fuses_a_relu6_chain_with_its_residual(rt, tmp_path):
    from rt_helpers import build_with_pipeline

    module = Chain(24, 144, 24, residual=True).eval()
    x = torch.randn(1, 24, 30, 30)
    pte = build_with_pipeline(module, [x], tmp_path / "run", FUSE)
    names = kernels_run(rt, pte, x)
    assert names == ["etb::expand_depthwise_project.out", "aten::add.out"], names
    with torch.no_grad():
        check_close(run_threads(rt, pte, x, threads=(1, 2)), module(x))


def test_pipeline_fuses_a_depthwise_separable_pair_with_relu(rt, tmp_path):
    from rt_helpers import build_with_pipeline

    module = Chain(32, 32, 16, stride=2, act=nn.ReLU, expand=False).eval()
    x = torch.randn(1, 32, 40, 40)
    pte = build_with_pipeline(module, [x], tmp_path / "run", FUSE)
    assert kernels_run(rt, pte, x) == ["etb::depthwise_project.out"]
    with torch.no_grad():
        check_close(run_threads(rt, pte, x, threads=(1, 2)), module(x))


@pytest.mark.parametrize(
    "case", ["hardswish", "expanded_is_an_output", "small_plane", "dilated", "by_default"]
)
def test_pipeline_leaves_what_it_must_not_fuse(rt, tmp_path, case):
    from rt_helpers import build_with_pipeline

    side = 20 if case == "small_plane" else 30  # 20x20 < 28x28
    module = Chain(8, 48, 16, act=nn.Hardswish if case == "hardswish" else nn.ReLU6,
                   also_expanded=case == "expanded_is_an_output",
                   dilation=2 if case == "dilated" else 1).eval()  # fmt: skip
    x = torch.randn(1, 8, side, side)
    # By default Float chains stay separate calls (ExecuTorch's runtime loads the program).
    overrides = ["model.dynamic_dims=[]"] if case == "by_default" else FUSE
    pte = build_with_pipeline(module, [x], tmp_path / "run", overrides)
    conv = "aten::convolution.out"
    names = kernels_run(rt, pte, x)
    if case == "expanded_is_an_output":  # only the depthwise -> project pair after it fuses
        # (the expansion's ReLU6 into the expansion, at load)
        assert names == [conv, "fused", "etb::depthwise_project.out"], names
    elif case == "hardswish":  # an activation the block has no bounds for (as lowered: ops)
        assert names.count(conv) == 3 and not any(n.startswith("etb::") for n in names), names
    else:
        assert names == [conv, "fused"] * 2 + [conv], names  # each ReLU6 fused at load
    with torch.no_grad():
        want = module(x)
    got = rt.load(str(pte)).run([x])
    for g, w in zip(got, want if isinstance(want, tuple) else (want,), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))
