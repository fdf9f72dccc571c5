"""Small models the tests build through the pipeline (``model._target_=models_for_tests.X``).

Each builder takes and ignores keyword arguments, because the tests compose on top of a zoo
config whose ``model.args`` (a dict) Hydra merges into rather than replaces.
Lines marked ``# MISSING-OP`` are looked up by the tests (the missing-op message must point
at them), so keep each such marker on the line that calls the unsupported op.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def _settle_bn(module: nn.Module) -> nn.Module:
    """Give every batch norm non-trivial statistics and affine terms, then go to eval."""
    gen = torch.Generator().manual_seed(123)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.5)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=gen) * 0.3)
    return module.eval()


class ConvBN(nn.Module):
    """conv (with or without bias) -> batch norm -> relu: BN folds into the conv."""

    def __init__(self, conv_bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=conv_bias)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.bn(self.conv(x)))


def conv_bn(**_: Any) -> nn.Module:
    return _settle_bn(ConvBN(conv_bias=False))


def conv_bias_bn(**_: Any) -> nn.Module:
    return _settle_bn(ConvBN(conv_bias=True))


class LinearBN(nn.Module):
    """linear -> BatchNorm1d -> relu -> linear: the BN folds into the first linear (addmm)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def linear_bn(**_: Any) -> nn.Module:
    return _settle_bn(LinearBN())


class StandaloneBN(nn.Module):
    """A batch norm right after a relu: no conv or linear to fold into."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: Tensor) -> Tensor:
        return self.bn(torch.relu(x)) * 2.0


def standalone_bn(**_: Any) -> nn.Module:
    return _settle_bn(StandaloneBN())


class PermutedWeight(nn.Module):
    """``x @ W.permute(1, 0)``: the permute of a constant weight folds away at build time."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 16))

    def forward(self, x: Tensor) -> Tensor:
        return torch.matmul(x, self.w.permute(1, 0)) + 1.0


def permuted_weight(**_: Any) -> nn.Module:
    return PermutedWeight().eval()


class NoOps(nn.Module):
    """A clone, a same-shape view and a contiguous() that move no data."""

    def forward(self, x: Tensor) -> Tensor:
        y = torch.relu(x).clone()
        y = y.view(y.shape)
        y = y.contiguous()
        return torch.sigmoid(y)


def no_ops(**_: Any) -> nn.Module:
    return NoOps().eval()


class TwoMissingOps(nn.Module):
    """Two distinct ops with no kernel in ops_yaml (each used at a marked line): one called
    directly, one that a torch module calls inside."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AdaptiveMaxPool1d(4)

    def forward(self, x: Tensor) -> Tensor:
        a = torch.special.erfcx(x)  # MISSING-OP erfcx
        b = self.pool(a)  # MISSING-OP pool
        return torch.relu(b)


def two_missing_ops(**_: Any) -> nn.Module:
    return TwoMissingOps().eval()


def not_a_module(**_: Any) -> object:
    return object()


class ViTBlock(nn.Module):
    """Pre-norm transformer block as people write it: fused qkv projection, heads split with
    view/transpose, F.scaled_dot_product_attention, GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """A small vision transformer: 4x4 patches of a 3x16x16 image, two blocks, mean pool."""

    def __init__(self, dim: int = 32, heads: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, stride=4)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.5)
        self.blocks = nn.Sequential(ViTBlock(dim, heads), ViTBlock(dim, heads))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


def tiny_vit(**_: Any) -> nn.Module:
    torch.manual_seed(7)
    return TinyViT().eval()
