"""The model the partitioner tests build: a convolution (which the toy backend refuses), then
elementwise chains it takes, broken by a broadcasting multiply it refuses, so the partitions
must be cut around it (a relu before it and an add after it may not share one)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ToyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(8, 3, 3, 3, generator=gen) * 0.5)
        self.scale = nn.Parameter(torch.randn(1, 8, 1, 1, generator=gen))
        self.shift = nn.Parameter(torch.randn(1, 8, 8, 8, generator=gen))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        z = torch.relu(y * 2.0 + self.shift) - y  # taken: one partition
        w = z * self.scale  # refused: broadcasting
        return torch.relu(w + z) - 0.5, z.mean(dim=(2, 3))  # the add and relu: another


def toy_net(**_: Any) -> nn.Module:
    return ToyNet()
