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
