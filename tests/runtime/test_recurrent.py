"""Recurrent models and the data-movement ops users' models export to: nn.GRU and nn.LSTM
(gates split with split_with_sizes, which the lower stage turns into slices; bidirectional
layers flip the sequence), chunk, flip and constant padding, against eager on randomized
shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rt_helpers import assert_matches
from torch import nn


class Tagger(nn.Module):
    """A sequence tagger: embedding-free features -> recurrent layer(s) -> per-step logits."""

    def __init__(self, cell: str, layers: int, bidirectional: bool, batch_first: bool) -> None:
        super().__init__()
        torch.manual_seed(layers * 10 + bidirectional * 2 + batch_first)
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = rnn(12, 16, num_layers=layers, bidirectional=bidirectional,
                       batch_first=batch_first)  # fmt: skip
        self.head = nn.Linear(16 * (2 if bidirectional else 1), 5)

    def forward(self, x):
        return self.head(self.rnn(x)[0]) * 4


@pytest.mark.parametrize(
    "cell, layers, bidirectional, batch_first",
    [
        ("gru", 1, False, True),
        ("gru", 2, True, False),
        ("lstm", 1, False, False),
        ("lstm", 2, True, True),
    ],
)
def test_recurrent_tagger_matches_eager(rt, pipeline_program, cell, layers, bidirectional,
                                        batch_first):  # fmt: skip
    module = Tagger(cell, layers, bidirectional, batch_first).eval()
    shape = (2, 7, 12) if batch_first else (7, 2, 12)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(shape, generator=gen)
    prog = rt.load(str(pipeline_program(module, [x])))
    prog.run([x], profile=True)
    names = {name for name, _ in prog.last_profile}
    assert not any("split" in n for n in names), names  # the gates are slices
    outs = []
    for inp in (x, torch.randn(shape, generator=gen) * 2):
        with torch.no_grad():
            want = module(inp)
        assert_matches(prog.run([inp])[0], want)
        outs.append(want)
    assert outs[0].std() > 0.1 and (outs[0] - outs[1]).std() > 0.1


@pytest.mark.parametrize("seed", range(6))
def test_chunk_and_flip(rt, pipeline_program, seed):
    gen = torch.Generator().manual_seed(seed)
    rank = 2 + seed % 3
    shape = [int(s) for s in torch.randint(2, 7, (rank,), generator=gen)]
    dim = seed % rank
    shape[dim] = 5 + seed  # chunks of unequal size when it does not divide
    flip_dims = [d for d in range(rank) if (seed >> d) & 1] or [rank - 1]

    class M(nn.Module):
        def forward(self, x):
            parts = x.chunk(3, dim=dim)
            return torch.cat([p.flip(flip_dims) * (i + 1) for i, p in enumerate(parts)], dim)

    x = torch.randn(shape, generator=gen)
    (got,) = rt.load(str(pipeline_program(M(), [x]))).run([x])
    assert torch.equal(got, M()(x))


@pytest.mark.parametrize("seed", range(6))
def test_constant_pad(rt, pipeline_program, seed):
    """F.pad in its default (constant) mode, pads that grow, crop (negative) or leave a dim."""
    gen = torch.Generator().manual_seed(seed)
    rank = 1 + seed % 4
    shape = [int(s) for s in torch.randint(2, 6, (rank,), generator=gen)]
    pad = [int(p) for p in torch.randint(-1, 3, (2 * min(rank, 1 + seed % 3),), generator=gen)]
    value = [0.0, 1.5, -2.0][seed % 3]

    class M(nn.Module):
        def forward(self, x):
            return F.pad(x * 2, pad, value=value)

    x = torch.randn(shape, generator=gen)
    (got,) = rt.load(str(pipeline_program(M(), [x]))).run([x])
    assert torch.equal(got, M()(x)), (shape, pad)
