"""The fp32 kernels on every SIMD path this machine can run.

``etb_runner`` (every kernel, no selection) is built once per session for each instruction-set level
the config can ask for: ``target.march=x86-64`` (SSE2), ``x86-64-v3`` (AVX2 + FMA), ``x86-64-v4``
(AVX-512, when this CPU has it), ``cascadelake`` (AVX-512 with VNNI, which the int8 GEMM uses, when
this CPU has it) and ``+target=linux_aarch64`` (NEON, built with the cross compiler and run under
qemu-aarch64, when both are installed; CI installs them). Each runner must report the path it was
built for (``--isa``, and the build stage's reading of the compile flags), then run one program
against torch: convolutions on randomized shapes (odd sizes, channels that are not a multiple of 16,
stride 2, padding, dilation 2, groups 2, depthwise 3x3 stride 1 and 2 on wide rows and small planes
(on planes and on channel lanes), depthwise 5x5 with a channel multiplier, 1x1 pointwise, Conv1d,
MobileNet blocks fused into one call),
linear/addmm with M in {1, 3, 7, 33} and odd N and K, mm and bmm, and convolutions and linear layers
followed by ReLU6 / ReLU, which Method load fuses into the kernel's epilogue.

The program holds every case (one input set and one output per case), so each runner runs once.
"""

from __future__ import annotations

import platform
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from etbuild_test_support import compose_config
from rt_helpers import assert_matches, build_with_pipeline
from torch import nn

from etbuild.pipeline import etbt
from etbuild.pipeline.config import validate
from etbuild.pipeline.paths import RUNTIME_SRC_DIR
from etbuild.pipeline.stages.build import cmake_args, kernel_isa_from_flags
from etbuild.pipeline.toolchain import resolve

SEED = 20240611  # the shapes are drawn once from this seed, so a failure reproduces


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


CPU = _cpu_flags()
X86 = platform.machine() in ("x86_64", "AMD64")
# What this CPU must have to run each x86-64 level (the flags /proc/cpuinfo names them by).
V3 = {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
AARCH64_TOOLS = shutil.which("aarch64-linux-gnu-g++") is not None and (
    shutil.which("qemu-aarch64") is not None or platform.machine() in ("aarch64", "arm64")
)

# (id, the path kernels/simd.h must take, config overrides, can this machine run it)
BUILDS = [
    ("x86-64", "sse2", ["target.march=x86-64"], X86, "not an x86-64 machine"),
    ("x86-64-v3", "avx2", ["target.march=x86-64-v3"], X86 and V3 <= CPU, "no AVX2/FMA here"),
    ("x86-64-v4", "avx512", ["target.march=x86-64-v4"], X86 and V4 <= CPU, "no AVX-512 here"),
    # AVX512-VNNI: the int8 GEMM's vpdpbusd path (activations as unsigned bytes)
    (
        "cascadelake",
        "avx512",
        ["target.march=cascadelake"],
        X86 and V4 | {"avx512_vnni"} <= CPU,
        "no AVX512-VNNI here",
    ),
    (
        "linux_aarch64",
        "neon",
        ["+target=linux_aarch64"],
        AARCH64_TOOLS,
        "needs g++-aarch64-linux-gnu and qemu-user (apt-get install; CI installs them)",
    ),
]
PARAMS = [
    pytest.param(
        name,
        isa,
        overrides,
        id=isa if name != "cascadelake" else "avx512-vnni",
        marks=pytest.mark.skipif(not ok, reason=why),
    )
    for name, isa, overrides, ok, why in BUILDS
]


@dataclass
class BuiltRunner:
    runner: Path
    build_dir: Path
    prefix: list[str]  # qemu for the aarch64 runner, else nothing


@pytest.fixture(scope="session")
def runners(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, list[str]], BuiltRunner]:
    """``get(name, overrides)``: the session's one ``etb_runner`` build (every kernel) for the
    config ``overrides``, configured exactly as the build stage configures it."""
    built: dict[str, BuiltRunner] = {}

    def get(name: str, overrides: list[str]) -> BuiltRunner:
        if name not in built:
            cfg = validate(compose_config(["model=mlp", *overrides]))
            tc = resolve(cfg.target)
            build_dir = tmp_path_factory.mktemp(f"isa_{name}")
            cmake = shutil.which("cmake") or "cmake"
            args = [*cmake_args(cfg, tc), "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]
            configure = subprocess.run(
                [cmake, "-S", str(RUNTIME_SRC_DIR), "-B", str(build_dir), "-G", "Ninja", *args],
                capture_output=True,
                text=True,
            )
            assert configure.returncode == 0, configure.stdout[-4000:] + configure.stderr[-4000:]
            build = subprocess.run(
                [cmake, "--build", str(build_dir), "--target", "etb_runner", "-j2"],
                capture_output=True,
                text=True,
            )
            assert build.returncode == 0, build.stdout[-6000:] + build.stderr[-3000:]
            assert tc.run_prefix is not None, tc.not_runnable_reason
            built[name] = BuiltRunner(build_dir / "etb_runner", build_dir, tc.run_prefix)
        return built[name]

    return get


# ---- the program: one layer (or layer + activation) per case ------------------------------


class MM(nn.Module):
    def forward(self, a, b):
        return torch.mm(a, b)


class BMM(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


class AddMM(nn.Module):
    def forward(self, s, a, b):
        return torch.addmm(s, a, b, beta=0.5, alpha=1.5)


@dataclass
class Case:
    name: str
    module: nn.Module
    shapes: list[list[int]]
    fused: bool = False  # a ReLU/ReLU6 that Method load fuses into the layer


class Suite(nn.Module):
    """Every case on its own inputs; returns one output per case."""

    def __init__(self, cases: list[Case]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(c.module for c in cases)
        self.arity = [len(c.shapes) for c in cases]

    def forward(self, *xs):
        outs, i = [], 0
        for layer, n in zip(self.layers, self.arity, strict=True):
            outs.append(layer(*xs[i : i + n]))
            i += n
        return tuple(outs)


def _cases(rng: random.Random) -> list[Case]:
    def odd(lo: int, hi: int) -> int:
        return rng.randrange(lo | 1, hi, 2)

    def chans(lo: int, hi: int) -> int:  # never a multiple of 16 (vector tails everywhere)
        while True:
            c = rng.randrange(lo, hi)
            if c % 16:
                return c

    def conv(name, cin, cout, hw, k, act=None, batch=1, bias=True, **kw) -> Case:
        layer = nn.Conv2d(cin, cout, k, bias=bias, **kw)
        return _with_act(name, layer, [[batch, cin, *hw]], act)

    def conv1d(name, cin, cout, length, k, **kw) -> Case:
        return Case(name, nn.Conv1d(cin, cout, k, **kw), [[1, cin, length]])

    def linear(name, m, k, n, act=None, bias=True) -> Case:
        return _with_act(name, nn.Linear(k, n, bias=bias), [[m, k]], act)

    def hw() -> list[int]:
        return [odd(5, 20), odd(5, 40)]

    def wide() -> list[int]:
        return [odd(5, 16), odd(35, 72)]

    cases = [
        conv("conv3x3", chans(3, 40), chans(5, 70), hw(), 3, padding=1),
        conv("conv5x5_s2_p2", chans(3, 30), chans(5, 50), hw(), 5, stride=2, padding=2),
        conv("conv3x3_dilation2", chans(3, 30), chans(5, 50), hw(), 3, dilation=2, padding=2),
        conv("conv3x3_s2_nopad", chans(3, 30), chans(5, 50), hw(), 3, stride=2),
        conv("conv3x3_groups2", 2 * odd(3, 14), 2 * odd(3, 22), hw(), 3, padding=1, groups=2),
        conv("conv3x1_s2x1", chans(3, 30), chans(5, 40), hw(), (3, 1), stride=(2, 1),
             padding=(1, 0)),
        conv("conv3x3_nobias_batch2", chans(3, 20), chans(5, 40), hw(), 3, batch=2, bias=False,
             padding=1),
        conv("pointwise1x1", chans(17, 100), chans(9, 80), hw(), 1),
        conv("pointwise1x1_relu", chans(17, 100), chans(9, 80), hw(), 1, act="relu"),
        # rows of B 2 KiB apart (16 x 32 pixels), on few sets of L1: copied into panels
        conv("pointwise1x1_aliasing_rows", chans(33, 60), chans(40, 80), [16, 32], 1),
        # at most 128 output channels over 128 or more: the product in two halves of depth
        conv("pointwise1x1_depth_halves", odd(129, 300), chans(9, 128), hw(), 1, act="relu6"),
        conv("conv3x3_relu6", chans(3, 40), chans(5, 70), hw(), 3, act="relu6", padding=1),
        conv("conv3x3_s2_relu", chans(3, 40), chans(5, 70), hw(), 3, act="relu", stride=2,
             padding=1),
        conv1d("conv1d_s2", chans(3, 40), chans(5, 50), odd(9, 62), 3, stride=2, padding=1),
        conv1d("conv1d_dilation2", chans(3, 40), chans(5, 50), odd(9, 62), 5, dilation=2,
               padding=4),
    ]  # fmt: skip
    # Depthwise rows wide enough for a 16-lane body and a tail at stride 2 as well.
    for stride in (1, 2):
        c = chans(8, 80)
        cases.append(conv(f"depthwise3x3_s{stride}", c, c, wide(), 3, stride=stride, padding=1,
                          groups=c))  # fmt: skip
    c = chans(8, 80)
    cases.append(conv("depthwise3x3_s2_relu6", c, c, wide(), 3, act="relu6", stride=2,
                      padding=1, groups=c))  # fmt: skip
    # Small planes run on channel lanes (transposes of the vector width) at stride 1 too.
    c = chans(8, 40)
    cases.append(conv("depthwise3x3_small_plane", c, c, [odd(3, 9), odd(3, 11)], 3, padding=1,
                      groups=c))  # fmt: skip
    c = chans(3, 20)
    cases.append(conv("depthwise5x5_mult2_small_plane", c, 2 * c, [odd(5, 9), odd(5, 9)], 5,
                      padding=2, groups=c, bias=False))  # fmt: skip
    # MobileNet blocks, which the partition stage fuses into one call (pipeline/blocks.py):
    # rows of pixels that fill no whole vector, so that its bands' products end in dot columns.
    for stride, expand in ((1, True), (2, True), (2, False)):
        c, e = chans(4, 30), chans(20, 100)
        cases.append(Case(f"block_s{stride}" + ("" if expand else "_no_expansion"),
                          _Block(c, e if expand else c, chans(5, 40), stride, expand),
                          [[1, c, odd(28, 40), odd(29, 45)]]))  # fmt: skip
    for m in (1, 3, 7, 33):
        cases.append(linear(f"linear_m{m}", m, odd(9, 300), odd(5, 200)))
    cases += [
        linear("linear_m7_relu6", 7, odd(9, 200), odd(5, 150), act="relu6"),
        linear("linear_m33_relu", 33, odd(9, 200), odd(5, 150), act="relu"),
        linear("linear_m3_nobias", 3, odd(9, 200), odd(5, 150), bias=False),
    ]
    m, k, n = odd(1, 40), odd(9, 200), odd(5, 150)
    cases.append(Case("addmm", AddMM(), [[m, n], [m, k], [k, n]]))
    for i in range(2):
        m, k, n = odd(1, 40), odd(9, 200), odd(5, 150)
        cases.append(Case(f"mm_{i}", MM(), [[m, k], [k, n]]))
    b, m, k, n = rng.randrange(2, 5), odd(1, 20), odd(9, 100), odd(5, 80)
    cases.append(Case("bmm", BMM(), [[b, m, k], [b, k, n]]))
    return cases


class _Block(nn.Module):
    """A MobileNetV2 block: a pointwise expansion (unless not `expand`) and a depthwise
    convolution, each followed by ReLU6, and a pointwise projection."""

    def __init__(self, c: int, e: int, o: int, stride: int, expand: bool) -> None:
        super().__init__()
        layers = [nn.Conv2d(c, e, 1), nn.ReLU6()] if expand else []
        layers += [nn.Conv2d(e, e, 3, stride, 1, groups=e), nn.ReLU6(), nn.Conv2d(e, o, 1)]
        with torch.no_grad():  # values of order one at each stage: ReLU6 clips at both ends
            for layer in layers[::2]:
                layer.weight.normal_(0, 3 * layer.weight[0].numel() ** -0.5)
                layer.bias.normal_(0, 1)
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x)


def _with_act(name: str, layer: nn.Module, shapes: list[list[int]], act: str | None) -> Case:
    with torch.no_grad():  # outputs of order a few units, so ReLU6 clips at both ends
        fan_in = layer.weight[0].numel()
        layer.weight.normal_(0, 3 * fan_in**-0.5)
        if layer.bias is not None:
            layer.bias.normal_(0, 1)
    if act is None:
        return Case(name, layer, shapes)
    activation = nn.ReLU6() if act == "relu6" else nn.ReLU()
    return Case(name, nn.Sequential(layer, activation), shapes, fused=True)


@dataclass
class Program:
    path: Path
    cases: list[Case]
    inputs: list[torch.Tensor]
    expected: list[torch.Tensor]


@pytest.fixture(scope="session")
def program(tmp_path_factory: pytest.TempPathFactory) -> Program:
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    cases = _cases(rng)
    suite = Suite(cases).eval()
    inputs = [torch.randn(shape) for c in cases for shape in c.shapes]
    with torch.no_grad():
        expected = list(suite(*inputs))
    overrides = ["model.dynamic_dims=[]", "pipeline.lower.fuse_float_blocks=true"]
    path = build_with_pipeline(suite, inputs, tmp_path_factory.mktemp("isa_program"), overrides)
    return Program(path, cases, inputs, expected)


def _runs_of(runners, program: Program, tmp_path_factory: pytest.TempPathFactory, tag: str):
    """``run(name, overrides, threads=1) -> (stdout, outputs)``: `program` run once on that
    runner at that thread count."""
    done: dict[tuple[str, int], tuple[str, list[torch.Tensor]]] = {}

    def run(name: str, overrides: list[str], threads: int = 1) -> tuple[str, list[torch.Tensor]]:
        if (name, threads) not in done:
            built = runners(name, overrides)
            d = tmp_path_factory.mktemp(f"isa_{tag}_{name}_{threads}t")
            cmd = [*built.prefix, str(built.runner), str(program.path)]
            for i, t in enumerate(program.inputs):
                etbt.write(d / f"input_{i}.etbt", t)
                cmd += ["--input", str(d / f"input_{i}.etbt")]
            cmd += ["--iters", "1", "--warmup", "0", "--profile", "--output-dir", str(d)]
            cmd += ["--threads", str(threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            assert re.search(rf"^threads: {threads}$", proc.stdout, re.M), proc.stdout[-2000:]
            outs = sorted(d.glob("output_*.etbt"), key=lambda p: int(p.stem.split("_")[1]))
            done[(name, threads)] = (proc.stdout, [etbt.read(p) for p in outs])
        return done[(name, threads)]

    return run


@pytest.fixture(scope="session")
def runs(runners, program: Program, tmp_path_factory: pytest.TempPathFactory):
    return _runs_of(runners, program, tmp_path_factory, "fp32")


# ---- the int8 program: every etb_quantized kernel with a SIMD path --------------------------


def _int8_cases(rng: random.Random) -> list[tuple[Case, list[torch.Tensor]]]:
    """int8 layers on inputs that give every vector path a body and a tail: convolutions of
    each path (im2col + GEMM with a last column panel of 1 to 16 columns, pointwise, grouped,
    stride 2, depthwise direct), linear layers (one row: the dot-product path), max pools on
    rows wider than a vector, average pools (column sums of rows wider than a vector), max
    over dims (runs and rows longer than a vector), add, and the fp32 boundaries."""
    from test_quantized import (
        Op,
        Q,
        avg_pool_case,
        avg_pool_module,
        conv_case,
        conv_module,
        depthwise_case,
        i8,
        weight_scales,
    )

    gen = torch.Generator().manual_seed(SEED)
    cases = []

    def case(name: str, module: nn.Module, *xs: torch.Tensor) -> None:
        cases.append((Case(name, module, [list(x.shape) for x in xs]), list(xs)))

    for seed in range(12):
        args, x = conv_case(seed)
        case(f"conv_case{seed}", conv_module(args), x)
    for seed in range(12):
        args, x = depthwise_case(seed)
        case(f"depthwise_case{seed}", conv_module(args), x)
    # (C, H, W, OC, k, stride, pad, groups)
    for c, h, w, oc, k, s, p, g in [
        (37, 17, 19, 45, 3, 1, 1, 1),  # 323 columns: panels and a tail of 3
        (20, 7, 7, 70, 3, 1, 1, 1),  # 49 columns: a last panel of one
        (3, 33, 35, 32, 3, 2, 1, 1),  # a first layer: stride-2 im2col of a wide row
        (3, 31, 45, 19, 7, 2, 3, 1),  # ResNet's first layer, narrower
        (150, 9, 13, 37, 1, 1, 0, 1),  # deep pointwise
        (96, 7, 7, 40, 1, 1, 0, 1),  # pointwise on 49 columns: the last by dot products
        (40, 32, 64, 20, 1, 1, 0, 1),  # pointwise, rows 2 KiB apart: a line's panels a pack
        (24, 11, 13, 30, 3, 2, 1, 3),  # grouped, stride 2
    ]:
        args = dict(xs=rng.uniform(0.01, 0.1), xzp=rng.choice([-128, -9, 0, 40]),
                    w=i8((oc, c // g, k, k), gen, -127, 127), ws=weight_scales(rng, gen, oc),
                    b=torch.randn(oc, generator=gen), stride=[s, s], padding=[p, p],
                    dilation=[1, 1], groups=g, os=0.3 + c / 20, ozp=rng.choice([-5, 0, 11]),
                    lo=-128, hi=127)  # fmt: skip
        case(f"conv{c}x{h}x{w}_oc{oc}_k{k}s{s}g{g}", conv_module(args), i8((1, c, h, w), gen))
    for m, k, o in [(1, 300, 37), (1, 17, 5), (5, 129, 70)]:
        layer = Op(lambda mod, x: Q.linear(x, 0.05, -3, mod.w, mod.ws, mod.b, 0.6, 2, -128, 127),
                   w=i8((o, k), gen, -127, 127), ws=weight_scales(rng, gen, o),
                   b=torch.randn(o, generator=gen))  # fmt: skip
        case(f"linear_m{m}_k{k}_o{o}", layer, i8((m, k), gen))
    for shape, kernel, stride, pad in [((2, 3, 21, 75), 3, 2, 1), ((1, 2, 6, 70), 3, 1, 1)]:
        window = ([kernel] * 2, [stride] * 2, [pad] * 2, [1, 1])
        pool = Op(lambda mod, x, w=window: Q.max_pool2d(x, *w, False))
        case(f"max_pool{kernel}s{stride}", pool, i8(shape, gen))
    for seed in (0, 2, 9, 15):
        args, x = avg_pool_case(seed)
        case(f"avg_pool_case{seed}", avg_pool_module(args), x)
    wide = [0.05, -9, [3, 3], [1, 2], [1, 1], True, False, None, 0.04, 3]
    case("avg_pool_wide", avg_pool_module(wide), i8((1, 2, 5, 613), gen))
    for shape, dims in [((2, 9, 77), [-1]), ((3, 7, 70), [1]), ((2, 3, 40, 6), [0, 3])]:
        amax = Op(lambda mod, x, d=dims: Q.amax(x, d, False))
        case(f"amax{len(shape)}d_{dims}", amax, i8(shape, gen))
    add = Op(lambda mod, a, b: Q.add(a, 0.03, -7, b, 0.05, 3, 0.06, -2, -128, 127))
    case("add", add, i8((2, 5, 9, 37), gen), i8((2, 5, 9, 37), gen))
    mul = Op(lambda mod, a, b: Q.mul(a, 0.03, -7, b, 0.05, 3, 0.2, -2, -128, 127))
    case("mul", mul, i8((2, 5, 9, 37), gen), i8((5, 9, 1), gen))  # a gate per row
    lookup = Op(lambda mod, x: Q.table_lookup(x, mod.t), t=i8((256,), gen))
    every = torch.arange(-128, 128, dtype=torch.int8)  # each entry, in vectors and the tail
    case("table_lookup", lookup, torch.cat([every, every.flip(0), every[:45]]).view(557))
    quant = Op(lambda mod, x: Q.quantize_per_tensor(x, 0.037, 5, -128, 127))
    case("quantize_per_tensor", quant, torch.randn(3, 77, generator=gen) * 3)
    dequant = Op(lambda mod, x: Q.dequantize_per_tensor(x, 0.021, -4))
    case("dequantize_per_tensor", dequant, i8((3, 77), gen))
    return cases


@pytest.fixture(scope="session")
def int8_program(tmp_path_factory: pytest.TempPathFactory) -> Program:
    pytest.importorskip("torchao")
    pairs = _int8_cases(random.Random(SEED))
    cases = [c for c, _ in pairs]
    suite = Suite(cases).eval()
    inputs = [x for _, xs in pairs for x in xs]
    with torch.no_grad():
        expected = list(suite(*inputs))
    path = build_with_pipeline(suite, inputs, tmp_path_factory.mktemp("isa_int8_program"))
    return Program(path, cases, inputs, expected)


@pytest.fixture(scope="session")
def int8_runs(runners, int8_program: Program, tmp_path_factory: pytest.TempPathFactory):
    return _runs_of(runners, int8_program, tmp_path_factory, "int8")


# ---- the channels-last program (pipeline.lower.channels_last): test_channels_last's cases ---


@pytest.fixture(scope="session")
def channels_last_program(tmp_path_factory: pytest.TempPathFactory) -> Program:
    from test_channels_last import CASES, OVERRIDES, Twice

    cases = [Case(name, Twice(conv, act), [list(shape)]) for name, conv, act, shape in CASES]
    suite = Suite(cases).eval()
    torch.manual_seed(SEED)
    inputs = [torch.randn(c.shapes[0]) for c in cases]
    with torch.no_grad():
        expected = list(suite(*inputs))
    path = build_with_pipeline(suite, inputs, tmp_path_factory.mktemp("isa_nhwc"), OVERRIDES)
    return Program(path, cases, inputs, expected)


@pytest.fixture(scope="session")
def channels_last_runs(runners, channels_last_program: Program, tmp_path_factory):
    return _runs_of(runners, channels_last_program, tmp_path_factory, "nhwc")


# ---- the tests ------------------------------------------------------------------------------


def _torch_differences(program: Program, outputs: list[torch.Tensor]) -> list[str]:
    """One line for each case whose output differs from torch's beyond float rounding."""
    assert len(outputs) == len(program.cases)
    failures = []
    for case, got, want in zip(program.cases, outputs, program.expected, strict=True):
        try:
            assert_matches(got, want, 1e-4)
        except AssertionError as exc:
            shapes = " ".join(str(s) for s in case.shapes)
            failures.append(f"{case.name} ({shapes}; {case.module}): {exc}")
    return failures


def _bit_differences(cases, got: list[torch.Tensor], want: list[torch.Tensor]) -> list[str]:
    """One line for each case whose output is not bit for bit the wanted one."""
    failures = []
    for case, g, w in zip(cases, got, want, strict=True):
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            differ = int((g != w).sum()) if g.shape == w.shape else "all"
            failures.append(f"{case.name}: {differ} of {w.numel()} elements differ")
    return failures


@pytest.mark.parametrize(("name", "isa", "overrides"), PARAMS)
def test_runner_reports_the_isa_it_was_built_for(runners, name, isa, overrides) -> None:
    built = runners(name, overrides)
    proc = subprocess.run(
        [*built.prefix, str(built.runner), "--isa"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == isa
    # The build stage's reading of the kernels' compile flags (all a non-runnable target gets).
    assert kernel_isa_from_flags(built.build_dir) == isa


@pytest.mark.parametrize(("name", "isa", "overrides"), PARAMS)
def test_kernels_match_torch(runs, program: Program, name, isa, overrides) -> None:
    stdout, outputs = runs(name, overrides)
    assert re.search(rf"^kernel_isa: {isa}$", stdout, re.M), stdout[-2000:]
    failures = _torch_differences(program, outputs)
    assert not failures, f"{isa}: {len(failures)} of {len(outputs)} cases differ from torch:\n" + (
        "\n".join(failures)
    )


@pytest.mark.parametrize(("name", "isa", "overrides"), PARAMS)
def test_channels_last_kernels_match_torch_at_any_thread_count(
    channels_last_runs, channels_last_program: Program, name, isa, overrides
) -> None:
    """The channels-last paths (depthwise on channel lanes, the stem's direct product, the
    GEMM with pixels as rows, the small-plane product) on each instruction set: torch's
    results, and one thread's bits at 2 threads."""
    prog = channels_last_program
    stdout, one = channels_last_runs(name, overrides)
    assert re.search(rf"^kernel_isa: {isa}$", stdout, re.M), stdout[-2000:]
    failures = _torch_differences(prog, one)
    _, two = channels_last_runs(name, overrides, 2)
    failures += _bit_differences(prog.cases, two, one)
    assert not failures, f"{isa}: " + "\n".join(failures)


@pytest.mark.parametrize(("name", "isa", "overrides"), PARAMS)
def test_int8_kernels_match_the_reference_exactly(
    int8_runs, int8_program: Program, name, isa, overrides
) -> None:
    """The int8 kernels' results do not depend on the instruction set: each path gives the
    reference ops' (pipeline/quant/ops.py) outputs bit for bit."""
    stdout, outputs = int8_runs(name, overrides)
    assert re.search(rf"^kernel_isa: {isa}$", stdout, re.M), stdout[-2000:]
    assert len(outputs) == len(int8_program.cases)
    failures = _bit_differences(int8_program.cases, outputs, int8_program.expected)
    assert not failures, f"{isa}: {len(failures)} of {len(outputs)} int8 cases differ:\n" + (
        "\n".join(failures)
    )


@pytest.mark.parametrize(("name", "isa", "overrides"), PARAMS)
@pytest.mark.parametrize("threads", [2, 3])
def test_every_path_gives_the_same_bits_at_any_thread_count(
    runs, int8_runs, program: Program, int8_program: Program, name, isa, overrides, threads
) -> None:
    """The work splits depend on the path (its GEMM tiles have 4 to 8 rows, 8 to 32 columns),
    so each path's split is checked: both programs at 2 and 3 threads give one thread's bits."""
    failures = []
    for run, prog in ((runs, program), (int8_runs, int8_program)):
        _, one = run(name, overrides)
        _, many = run(name, overrides, threads)
        assert len(one) == len(many) == len(prog.cases)
        failures += _bit_differences(prog.cases, many, one)
    assert not failures, f"{isa} at {threads} threads against 1: " + "\n".join(failures)


@pytest.mark.parametrize(("name", "isa", "overrides"), PARAMS)
def test_activations_run_fused_into_the_layer(runs, program: Program, name, isa, overrides):
    """Each ReLU/ReLU6 after a convolution or linear layer runs in its epilogue (the fused
    clamp of every SIMD path is what test_kernels_match_torch compared)."""
    stdout, _ = runs(name, overrides)
    fused = len(re.findall(r"^profile: fused ", stdout, re.M))
    assert fused == sum(c.fused for c in program.cases), stdout[-3000:]


def test_blocks_run_as_one_call(runs, program: Program) -> None:
    """The program's MobileNet blocks are what test_kernels_match_torch compares on each path
    (the partition stage fused them)."""
    stdout, _ = runs("x86-64", ["target.march=x86-64"]) if X86 else runs(*BUILDS[-1][:3:2])
    calls = re.findall(r"^profile: etb::(\w+)\.out ", stdout, re.M)
    assert sorted(calls) == ["depthwise_project"] + ["expand_depthwise_project"] * 2, calls


def test_host_module_takes_the_vector_path(rt) -> None:
    """etbuild.runtime is built with target.march's default (native): on a CPU with AVX2 and
    FMA its kernels take the AVX2 or AVX-512 path, never the SSE2 or scalar fallback."""
    assert rt.kernel_isa() in ("avx512", "avx2", "sse2", "neon", "scalar")
    if not {"avx2", "fma"} <= CPU:
        pytest.skip("this CPU has no AVX2 + FMA")
    assert rt.kernel_isa() in ("avx2", "avx512")
    if "avx512f" in CPU:
        assert rt.kernel_isa() == "avx512"


@pytest.mark.parametrize(
    ("march", "verify_on"), [("", True), ("armv8.2-a", True), ("armv8.2-a", False)]
)
def test_report_says_where_the_isa_comes_from(tmp_path: Path, march: str, verify_on: bool):
    """For a target that cannot run here (android, cortex_m; neither is built in this test),
    verify and report give the path the compile flags give (the build stage's reading)."""
    from etbuild.pipeline.config import TargetKind
    from etbuild.pipeline.runner import Context, StageRecord
    from etbuild.pipeline.stages import verify
    from etbuild.pipeline.stages.report import _kernels_line
    from etbuild.pipeline.toolchain import Toolchain

    tc = Toolchain(
        kind=TargetKind.android,
        cmake_args=[],
        strip="",
        nm="",
        run_prefix=None,
        not_runnable_reason="no Android device is attached",
        march=march,
    )
    ctx = Context(compose_config(["model=mlp"]), tmp_path)
    ctx.artifacts.update(toolchain=tc, kernel_isa="neon")
    arch = f"`-march={march}`" if march else "the toolchain's default `-march`"
    threads = "- threads: 1 (target.threads: `etb_runner --threads 1`, `load(path, threads=1)`)"
    if not verify_on:
        line = f"- kernels: {arch}, SIMD path `neon` (from the compile flags)"
        assert _kernels_line(ctx.artifacts) == [line, threads]
        return
    ctx.records.append(StageRecord("verify"))
    verify.run(ctx)
    isa = "neon (the target's path from its compile flags; not run)"
    assert ctx.current.summary["kernel_isa"] == isa
    assert ctx.current.summary["status"].startswith("built, not run")
    assert _kernels_line(ctx.artifacts) == [f"- kernels: {arch}, SIMD path {isa}", threads]


def test_runner_isa_flag_takes_no_other_arguments(runners) -> None:
    if not X86:
        pytest.skip("not an x86-64 machine")
    built = runners("x86-64", ["target.march=x86-64"])
    proc = subprocess.run([str(built.runner), "--isa", "extra"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr
