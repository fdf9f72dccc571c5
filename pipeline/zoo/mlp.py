"""A plain multilayer perceptron: Linear + ReLU stack."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


class MLP(nn.Module):
    """Linear+ReLU hidden layers and a linear head; input [N, in_features] float."""

    def __init__(self, in_features: int, hidden: Sequence[int], out_features: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            linear = nn.Linear(width, h)
            # He init keeps activations of order one through the ReLUs.
            nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
            nn.init.zeros_(linear.bias)
            layers += [linear, nn.ReLU()]
            width = h
        head = nn.Linear(width, out_features)
        nn.init.kaiming_normal_(head.weight, nonlinearity="linear")
        nn.init.zeros_(head.bias)
        layers.append(head)
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


def mlp(
    in_features: int = 64, hidden: Sequence[int] = (256, 256), out_features: int = 10
) -> nn.Module:
    """Build a randomly initialised MLP; input [N, in_features], output [N, out_features]."""
    return MLP(in_features, list(hidden), out_features)
