"""Threads: a program loaded with threads=N splits its kernels' work over N threads, with
outputs bit-identical to one thread, and a bad thread count is refused with a clear error."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class Net(nn.Module):
    """Pointwise, 3x3, depthwise and grouped convolutions with fused activations, a linear
    layer at batch 3 and one at batch 1: every GEMM shape class the kernels split."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 24, 3, 2, 1)
        self.expand = nn.Conv2d(24, 72, 1)
        self.dw = nn.Conv2d(72, 72, 3, 1, 1, groups=72)
        self.grouped = nn.Conv2d(72, 36, 3, 1, 1, groups=3)
        self.project = nn.Conv2d(36, 40, 1)
        self.fc = nn.Linear(40, 130)
        self.head = nn.Linear(130, 1000)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = nn.functional.relu6(self.expand(x))
        x = nn.functional.relu6(self.dw(x))
        x = self.project(torch.relu(self.grouped(x)))
        tokens = x.flatten(2).transpose(1, 2)[:, :3]  # [1, 3, 40]
        h = torch.relu(self.fc(tokens))
        return h, self.head(h.mean(1))


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    from rt_helpers import build_with_pipeline

    torch.manual_seed(0)
    x = torch.randn(1, 3, 45, 37)
    pte = build_with_pipeline(Net().eval(), [x], tmp_path_factory.mktemp("threads"))
    return pte, x


def test_outputs_are_bit_identical_at_any_thread_count(rt, program):
    pte, x = program
    runs = {}
    for threads in (1, 2, 4):
        prog = rt.load(str(pte), threads=threads)
        assert prog.num_threads == threads
        runs[threads] = [prog.run([x]) for _ in range(3)]
    one = runs[1][0]
    assert one[0].abs().max() > 0.1 and one[1].std() > 0.01  # outputs of order one that vary
    for threads, outs in runs.items():
        for out in outs:
            for got, ref in zip(out, one, strict=True):
                assert torch.equal(got, ref), f"threads={threads} differs from one thread"


def test_thread_count_is_checked(rt, program):
    pte, _ = program
    with pytest.raises(rt.Error, match="threads must be >= 1, got 0"):
        rt.load(str(pte), threads=0)
    with pytest.raises(rt.Error, match="threads must be <= 64, got 65"):
        rt.load(str(pte), threads=65)


class LargePlanes(nn.Module):
    """A MobileNetV2 block and a residual on planes that the threads split by pixels (at least
    56x56, kernel/parallel.h): pointwise products by runs of columns (an expansion, and a
    projection of 144 channels into 24 that smaller planes take in halves of the depth), the
    depthwise convolutions (stride 1 and 2) by bands of rows, the residual add by runs of
    every plane, a 3x3 convolution's padded copy by bands of rows (its product by runs of
    columns). 60x61 pixels: the columns end in a partial tile and dot columns."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 24, 3, 2, 1)
        self.expand = nn.Conv2d(24, 144, 1)
        self.dw = nn.Conv2d(144, 144, 3, 1, 1, groups=144)
        self.project = nn.Conv2d(144, 24, 1)
        self.down = nn.Conv2d(24, 24, 3, 2, 1, groups=24)
        self.conv = nn.Conv2d(24, 24, 3, 1, 1)

    def forward(self, x):
        x = nn.functional.relu6(self.stem(x))
        h = nn.functional.relu6(self.dw(nn.functional.relu6(self.expand(x))))
        y = x + self.project(h)
        return y, self.down(y), torch.relu(self.conv(y))


def test_large_planes_split_by_pixels_bit_identically(rt, tmp_path):
    from rt_helpers import build_with_pipeline

    torch.manual_seed(2)
    x = torch.randn(1, 3, 120, 121)
    module = LargePlanes().eval()
    pte = build_with_pipeline(module, [x], tmp_path)
    with torch.no_grad():
        want = module(x)
    one = rt.load(str(pte), threads=1).run([x])
    for got, ref in zip(one, want, strict=True):
        assert ref.std() > 0.1  # outputs of order one that vary
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    for threads in (2, 3, 4):
        outs = rt.load(str(pte), threads=threads).run([x])
        for i, (got, ref) in enumerate(zip(outs, one, strict=True)):
            assert torch.equal(got, ref), f"output {i} at threads={threads} differs from one"


class Elementwise(nn.Module):
    """The elementwise, reduction and pooling kernels that split their work over threads, on
    tensors big enough to be split (64K elements, more than one task each)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.randn(16, 1, 1))
        self.norm = nn.LayerNorm(64)
        with torch.no_grad():
            self.norm.weight.normal_()
            self.norm.bias.normal_()

    def forward(self, x, y):
        a = torch.relu(x * self.scale + y)  # broadcast mul, add; relu
        b = nn.functional.hardswish(a - x) / (torch.sigmoid(y) + 0.5)
        soft = torch.softmax(b, dim=-1) + torch.softmax(b, dim=1)  # inner and strided rows
        pooled = nn.functional.avg_pool2d(b, 3, 2, 1) + nn.functional.adaptive_avg_pool2d(b, 32)
        return soft, pooled, self.norm(b), b.mean((2, 3)), torch.tanh(a)


class Int8Elementwise(nn.Module):
    """The int8 elementwise kernels that split their work: quantize, add, max pool, mean,
    dequantize."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("ramp", torch.linspace(0.1, 1.0, 16).view(16, 1, 1))

    def forward(self, x, y):
        Q = pytest.importorskip("etbuild.pipeline.quant.ops").ops
        qx = Q.quantize_per_tensor(x * self.ramp, 0.03, 3, -128, 127)
        qy = Q.quantize_per_tensor(y, 0.05, -7, -128, 127)
        s = Q.add(qx, 0.03, 3, qy, 0.05, -7, 0.06, 1, -128, 127)
        p = Q.max_pool2d(s, [3, 3], [1, 1], [1, 1], [1, 1], False)
        m = Q.mean(p, 0.06, 1, [2, 3], True, 0.02, -2)
        return Q.dequantize_per_tensor(p, 0.06, 1), Q.dequantize_per_tensor(m, 0.02, -2)


@pytest.mark.parametrize("net", [Elementwise, Int8Elementwise])
def test_elementwise_and_reductions_split_bit_identically(rt, tmp_path, net):
    from rt_helpers import build_with_pipeline

    torch.manual_seed(1)
    if net is Int8Elementwise:
        pytest.importorskip("torchao")
    inputs = [torch.randn(1, 16, 64, 64), torch.randn(1, 16, 64, 64)]
    module = net().eval()
    pte = build_with_pipeline(module, inputs, tmp_path)
    with torch.no_grad():
        want = module(*inputs)
    one = rt.load(str(pte), threads=1).run(inputs)
    for got, ref in zip(one, want, strict=True):
        assert ref.std() > 0.01  # outputs of order one that vary
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    for threads in (2, 3, 4):
        outs = rt.load(str(pte), threads=threads).run(inputs)
        for i, (got, ref) in enumerate(zip(outs, one, strict=True)):
            assert torch.equal(got, ref), f"output {i} at threads={threads} differs from one"


def test_many_short_loops_never_hang(rt, program, tmp_path):
    """Thousands of parallel loops, most only microseconds long, in a process of its own with
    a deadline: a lost wake-up between the caller and the workers would hang it."""
    import subprocess
    import sys

    pte, x = program
    torch.save(x, tmp_path / "x.pt")
    script = (
        "import sys, torch\n"
        f"sys.path[:0] = {sys.path!r}\n"
        "import etbuild.runtime as rt\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        f"p = rt.load({str(pte)!r}, threads=2)\n"
        "for _ in range(400):\n"
        "    p.run([x])\n"
        "print('done')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]
