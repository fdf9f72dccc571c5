"""etb_quantized::expand_depthwise_project: a pointwise expansion, a depthwise convolution and
a pointwise projection in one kernel call, a band of rows at a time. Its output must be
exactly the reference's (three conv2d), whatever the bands, threads and padding rows."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torchao")

from test_quantized import Op, i8, run_exact, weight_scales  # noqa: E402

from etbuild.pipeline.quant import ops as qops  # noqa: E402

Q = qops.ops


def _scale_for(acc: torch.Tensor, mult: torch.Tensor) -> float:
    """An output scale that puts the stage's values about 40 codes from zero on average, so
    that every stage's int8 tensor varies (neither all clamped nor all zero)."""
    y = acc * mult.reshape(1, -1, 1, 1)
    return float(y.std()) / 40 + 1e-6


def block_case(
    seed: int, n, c, h, w, e, o, k, stride, pad, separable: bool = False
) -> tuple[dict, torch.Tensor]:
    """A block's arguments, each stage's output scale chosen from its actual values;
    ``separable`` (e == c): those of a depthwise_project, whose depthwise stage reads x."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    x = i8((n, c, h, w), gen)
    a = dict(xs=rng.uniform(0.01, 0.1), xzp=rng.choice([-128, -7, 0, 12]))
    a["we"] = i8((e, c, 1, 1), gen, -127, 127)
    a["wd"] = i8((e, 1, k, k), gen, -127, 127)
    a["wp"] = i8((o, e, 1, 1), gen, -127, 127)
    a["wes"], a["wds"], a["wps"] = (weight_scales(rng, gen, ch) for ch in (e, e, o))
    a["be"] = None if rng.random() < 0.3 else torch.randn(e, generator=gen)
    a["bd"] = torch.randn(e, generator=gen)
    a["bp"] = None if rng.random() < 0.5 else torch.randn(o, generator=gen)
    a["stride"], a["padding"] = [stride, stride], [pad, pad]
    # Each stage's scale from its accumulators; ReLU6-like clamps on the first two (as in
    # MobileNetV2), a plain output (the projection is linear).
    acc = F.conv2d(x.double() - a["xzp"], a["we"].double()).float()
    a["es"] = _scale_for(acc, a["xs"] * a["wes"])
    a["ezp"] = rng.choice([-128, -100, 0])
    a["emin"], a["emax"] = a["ezp"], min(127, a["ezp"] + 200)
    ex = qops.conv2d(x, a["xs"], a["xzp"], a["we"], a["wes"], a["be"], [1, 1], [0, 0], [1, 1], 1,
                     a["es"], a["ezp"], a["emin"], a["emax"])  # fmt: skip
    if separable:
        ex, a["es"], a["ezp"] = x, a["xs"], a["xzp"]
    acc = F.conv2d(ex.double() - a["ezp"], a["wd"].double(), None, stride, pad, 1, e).float()
    a["fs"] = _scale_for(acc, a["es"] * a["wds"])
    a["fzp"] = rng.choice([-128, -3, 0])
    a["fmin"], a["fmax"] = a["fzp"], 127
    fi = qops.conv2d(ex, a["es"], a["ezp"], a["wd"], a["wds"], a["bd"], a["stride"],
                     a["padding"], [1, 1], e, a["fs"], a["fzp"], a["fmin"], a["fmax"])  # fmt: skip
    acc = F.conv2d(fi.double() - a["fzp"], a["wp"].double()).float()
    a["os"] = _scale_for(acc, a["fs"] * a["wps"])
    a["ozp"] = rng.choice([-5, 0, 9])
    return a, x


def _tail(m: Op, a: dict) -> tuple:
    """The depthwise and projection arguments that both ops end with."""
    return (m.wd, m.wds, m.c("bd"), a["stride"], a["padding"], a["fs"], a["fzp"], a["fmin"],
            a["fmax"], m.wp, m.wps, m.c("bp"), a["os"], a["ozp"], -128, 127)  # fmt: skip


def block_module(a: dict) -> Op:
    def forward(m, x):
        head = (x, a["xs"], a["xzp"], m.we, m.wes, m.c("be"), a["es"], a["ezp"], a["emin"],
                a["emax"])  # fmt: skip
        return Q.expand_depthwise_project(*head, *_tail(m, a))

    weights = ("we", "wes", "be", "wd", "wds", "bd", "wp", "wps", "bp")
    return Op(forward, **{k: a[k] for k in weights})


def separable_module(a: dict) -> Op:
    """depthwise_project on the block's input (a case whose depthwise stage reads it)."""
    return Op(
        lambda m, x: Q.depthwise_project(x, a["xs"], a["xzp"], *_tail(m, a)),
        **{k: a[k] for k in ("wd", "wds", "bd", "wp", "wps", "bp")},
    )


def check_block(rt, pipeline_program, shape, threads: int, seed: int = 0) -> None:
    a, x = block_case(seed, *shape)
    module = block_module(a)
    want = module(x)
    # A comparison of outputs that are all one value would prove nothing.
    assert want.float().std() > 10 and len(torch.unique(want)) > 50, want.float().std()
    run_exact(rt, pipeline_program, module, [x], threads=threads)


SHAPES = [
    # n, c, h, w, e, o, k, stride, pad
    (1, 16, 112, 112, 96, 24, 3, 2, 1),  # MobileNetV2's first expanding block: many bands
    (1, 24, 56, 56, 144, 24, 3, 1, 1),  # a stride-1 block: bands share two expanded rows
    (2, 8, 23, 17, 48, 12, 3, 2, 1),  # two images, odd sizes: the last row's taps pad
    (1, 5, 19, 21, 30, 7, 5, 1, 2),  # 5x5, padding 2: two padding rows at each end
    (1, 6, 20, 13, 24, 9, 5, 2, 0),  # no padding, stride 2: a band reads rows to the end
    (1, 3, 3, 3, 8, 5, 3, 1, 2),  # a plane smaller than its padding
    (1, 32, 9, 70, 600, 16, 3, 1, 1),  # wide rows of many channels: a band of one row
    # Planes below 28x28 split their channels over the threads (slices of 16 or 48 channels):
    (1, 96, 14, 14, 576, 96, 3, 1, 1),  # MobileNetV2's 14x14 blocks
    (1, 96, 14, 14, 576, 160, 3, 2, 1),  # ... and its 14x14 -> 7x7 one
    (2, 160, 7, 7, 960, 160, 3, 1, 1),  # its 7x7 blocks, two images
    (1, 24, 9, 11, 12, 12, 5, 1, 2),  # fewer channels than a slice: one slice at any count
]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(i) for i in range(len(SHAPES))])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_block_equals_three_convolutions(rt, pipeline_program, shape, threads):
    check_block(rt, pipeline_program, shape, threads)


@pytest.mark.parametrize("seed", range(4))
def test_block_randomized(rt, pipeline_program, seed):
    rng = random.Random(100 + seed)
    k = rng.choice([3, 5])
    shape = (rng.choice([1, 2]), rng.choice([4, 16, 24]), rng.randint(k, 40),
             rng.randint(k, 40), rng.choice([24, 96, 144]), rng.choice([8, 24, 40]), k,
             rng.choice([1, 2]), rng.randint(0, k - 1))  # fmt: skip
    check_block(rt, pipeline_program, shape, threads=rng.choice([1, 3]), seed=seed)


@pytest.mark.parametrize("shape", SHAPES[:6], ids=[str(i) for i in range(6)])
@pytest.mark.parametrize("threads", [1, 3])
def test_depthwise_project_equals_two_convolutions(rt, pipeline_program, shape, threads):
    n, c, h, w, _e, o, k, stride, pad = shape
    a, x = block_case(1, n, c, h, w, c, o, k, stride, pad, separable=True)
    module = separable_module(a)
    want = module(x)
    assert want.float().std() > 10 and len(torch.unique(want)) > 50, want.float().std()
    run_exact(rt, pipeline_program, module, [x], threads=threads)


def test_a_depthwise_kernel_it_has_no_path_for_is_an_error(rt, pipeline_program):
    a, x = block_case(0, 1, 4, 10, 10, 8, 4, 3, 1, 1)
    a["wd"] = i8((8, 1, 4, 4), torch.Generator().manual_seed(1), -127, 127)
    prog = rt.load(str(pipeline_program(block_module(a), [x])))
    with pytest.raises(
        rt.Error, match=r"expand_depthwise_project: the block needs .* a 3x3 or 5x5"
    ):
        prog.run([x])


# ---- the pipeline's fusion of three conv2d calls (pipeline/blocks.py) --------------------


def chain_module(
    a: dict, dilation: int = 1, also_expanded: bool = False, expand: bool = True
) -> Op:
    """The block as three conv2d calls (two without ``expand``); ``also_expanded`` returns the
    expanded tensor too."""

    def forward(m, x):
        e = x
        if expand:
            e = Q.conv2d(x, a["xs"], a["xzp"], m.we, m.wes, m.c("be"), [1, 1], [0, 0], [1, 1],
                         1, a["es"], a["ezp"], a["emin"], a["emax"])  # fmt: skip
        f = Q.conv2d(e, a["es"], a["ezp"], m.wd, m.wds, m.c("bd"), a["stride"], a["padding"],
                     [dilation, dilation], m.wd.shape[0], a["fs"], a["fzp"], a["fmin"],
                     a["fmax"])  # fmt: skip
        y = Q.conv2d(f, a["fs"], a["fzp"], m.wp, m.wps, m.c("bp"), [1, 1], [0, 0], [1, 1], 1,
                     a["os"], a["ozp"], -128, 127)  # fmt: skip
        return (y, e) if also_expanded else y

    return Op(forward, **{k: a[k] for k in ("we", "wes", "be", "wd", "wds", "bd", "wp", "wps",
                                               "bp")})  # fmt: skip


def kernels_run(rt, pte, x) -> list[str]:
    prog = rt.load(str(pte))
    prog.run([x], profile=True)
    return [name for name, _ in prog.last_profile]


@pytest.mark.parametrize("side", [30, 14])  # bands of rows; a small plane's channel slices
def test_pipeline_fuses_a_chain_into_one_exact_call(rt, pipeline_program, side):
    a, x = block_case(3, 1, 16, side, side, 96, 24, 3, 1, 1)
    module = chain_module(a)
    pte = pipeline_program(module, [x])
    names = kernels_run(rt, pte, x)
    assert names == ["etb_quantized::expand_depthwise_project.out"], names
    run_exact(rt, pipeline_program, module, [x], threads=2)


def test_pipeline_fuses_a_depthwise_separable_pair_into_one_exact_call(rt, pipeline_program):
    a, x = block_case(5, 1, 24, 30, 30, 24, 16, 3, 2, 1, separable=True)
    module = chain_module(a, expand=False)
    pte = pipeline_program(module, [x])
    names = kernels_run(rt, pte, x)
    assert names == ["etb_quantized::depthwise_project.out"], names
    run_exact(rt, pipeline_program, module, [x], threads=2)


@pytest.mark.parametrize(
    "case",
    ["expanded_is_an_output", "dilated_depthwise", "switched_off"],
)
def test_pipeline_leaves_what_it_must_not_fuse(rt, tmp_path, case):
    from rt_helpers import build_with_pipeline

    side = 30
    a, x = block_case(4, 1, 8, side, side, 48, 16, 3, 1, 2 if case == "dilated_depthwise" else 1)
    module = chain_module(a, dilation=2 if case == "dilated_depthwise" else 1,
                          also_expanded=case == "expanded_is_an_output")  # fmt: skip
    overrides = ["model.dynamic_dims=[]"]
    if case == "switched_off":
        overrides.append("pipeline.lower.fuse_blocks=false")
    pte = build_with_pipeline(module, [x], tmp_path / "run", overrides)
    conv = "etb_quantized::conv2d.out"
    # The expanded tensor is an output: only the depthwise -> project pair after it fuses.
    pair = [conv, "etb_quantized::depthwise_project.out"]
    assert kernels_run(rt, pte, x) == (pair if case == "expanded_is_an_output" else [conv] * 3)
    module.eval()
    want = module(x)
    got = rt.load(str(pte)).run([x])
    for g, w in zip(got, want if isinstance(want, tuple) else (want,), strict=True):
        assert torch.equal(g, w)
