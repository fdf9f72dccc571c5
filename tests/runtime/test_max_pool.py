"""max_pool2d_with_indices against torch: values and indices on randomized shapes that take
the vector path (stride 1 or 2 with whole windows inside the row), its edges (the first and
last outputs, the overlapping last block) and the scalar path (dilation, stride 3), with NaN
and -inf in the input."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn


class PoolWithIndices(nn.Module):
    def __init__(self, k, s, p, d, ceil) -> None:
        super().__init__()
        self.args = (k, s, p, d, ceil)

    def forward(self, x):
        k, s, p, d, ceil = self.args
        return nn.functional.max_pool2d(x, k, s, p, d, ceil_mode=ceil, return_indices=True)


def _case(seed: int):
    rng = random.Random(seed)
    k = rng.choice([2, 3, 3, 5])
    s = rng.choice([1, 2, 2, 3])
    p = rng.randint(0, k // 2)
    d = rng.choice([1, 1, 1, 2])
    h, w = rng.randint(k * d, 40), rng.randint(k * d, 70)
    return (k, s, p, d, rng.random() < 0.3), (rng.randint(1, 2), rng.randint(1, 5), h, w)


@pytest.mark.parametrize("seed", range(16))
def test_values_and_indices(rt, pipeline_program, seed):
    args, shape = _case(seed)
    torch.manual_seed(seed)
    x = torch.randn(shape)
    if seed % 4 == 0:  # special values: a NaN wins its windows, -inf never beats a number
        flat = x.view(-1)
        flat[torch.randint(0, flat.numel(), (3,))] = float("nan")
        flat[torch.randint(0, flat.numel(), (5,))] = float("-inf")
    module = PoolWithIndices(*args).eval()
    want_v, want_i = module(x)
    prog = rt.load(str(pipeline_program(module, [x])))
    got_v, got_i = prog.run([x])
    assert torch.equal(got_v.isnan(), want_v.isnan())
    keep = ~want_v.isnan()
    assert torch.equal(got_v[keep], want_v[keep])
    assert torch.equal(got_i[keep], want_i[keep])


@pytest.mark.parametrize(
    "args, shape",
    [
        ((3, 2, 1, 1, False), (1, 2, 29, 70)),  # ResNet18's stem pool: the first row is cut
        ((3, 2, 1, 1, True), (1, 3, 30, 69)),  # ceil mode: the last row is cut too
        ((5, 1, 2, 1, False), (2, 2, 20, 50)),  # two cut rows at the top and at the bottom
    ],
)
def test_rows_cut_by_the_padding(rt, pipeline_program, args, shape):
    """Output rows whose window the padding cuts take the vector path over the rows left."""
    torch.manual_seed(sum(shape))
    x = torch.randn(shape)
    module = PoolWithIndices(*args).eval()
    want_v, want_i = module(x)
    got_v, got_i = rt.load(str(pipeline_program(module, [x]))).run([x])
    assert torch.equal(got_v, want_v) and torch.equal(got_i, want_i)
