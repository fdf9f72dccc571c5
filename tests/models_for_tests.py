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


# -- the architectures users bring, written the way people write them ----------------------


def _widened(model: nn.Module, classifier: nn.Linear, gain: float = 4.0) -> nn.Module:
    """``model`` in eval mode with its classifier's weights scaled by ``gain``: with seeded
    random weights, features pooled over space or time vary little from input to input, and
    a comparison of nearly constant logits would prove nothing."""
    with torch.no_grad():
        classifier.weight.mul_(gain)
    return model.eval()


def _conv_bn_act(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
                 act: type[nn.Module] = nn.ReLU) -> nn.Sequential:  # fmt: skip
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        act(),
    )


class TinyUNet(nn.Module):
    """Two-level U-Net: max-pool down, a transposed convolution and bilinear F.interpolate up,
    skip connections by concatenation, GroupNorm in the bottleneck."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(_conv_bn_act(3, 8), _conv_bn_act(8, 8))
        self.enc2 = nn.Sequential(_conv_bn_act(8, 16), _conv_bn_act(16, 16))
        self.mid = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU())
        self.upsample = nn.ConvTranspose2d(32, 32, 2, stride=2)
        self.up2 = _conv_bn_act(32 + 16, 16)
        self.up1 = _conv_bn_act(16 + 8, 8)
        self.head = nn.Conv2d(8, classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        s1 = self.enc1(x)
        s2 = self.enc2(nn.functional.max_pool2d(s1, 2))
        m = self.mid(nn.functional.max_pool2d(s2, 2))
        u2 = self.upsample(m)
        u2 = self.up2(torch.cat([u2, s2], dim=1))
        u1 = nn.functional.interpolate(u2, size=s1.shape[-2:], mode="bilinear")
        return self.head(self.up1(torch.cat([u1, s1], dim=1)))


def unet(**_: Any) -> nn.Module:
    return TinyUNet().eval()


class Bottleneck(nn.Module):
    """ResNet-50 v1.5's block: 1x1 reduce, 3x3 (strided when it downsamples), 1x1 expand, and
    a strided 1x1 projection of the block input on the shortcut when the shape changes."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int) -> None:
        super().__init__()
        self.reduce = _conv_bn_act(cin, mid, 1)
        self.conv = _conv_bn_act(mid, mid, 3, stride)
        self.expand = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.project = nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.expand(self.conv(self.reduce(x)))
        return torch.relu(out + self.project(x))


class BottleneckResNet(nn.Module):
    """A ResNet-50-style network at 32x32 whose peak memory is a downsampling bottleneck
    block: the module runs the shortcut's projection last, beside the expanded branch."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = _conv_bn_act(3, 64)
        self.blocks = nn.Sequential(Bottleneck(64, 32, 128, 2), Bottleneck(128, 64, 256, 2))
        self.fc = nn.Linear(256, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def bottleneck_resnet(**_: Any) -> nn.Module:
    model = BottleneckResNet()
    return _widened(model, model.fc)


class AudioCNN(nn.Module):
    """A 1-D convolutional classifier over 40 MFCC features x 101 frames: Conv1d with
    stride, dilation and groups, batch norm, then a max over time."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(40, 64, 5, padding=2), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 64, 3, padding=2, dilation=2, groups=4), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 32, 3, stride=2), nn.BatchNorm1d(32), nn.ReLU(),
        )  # fmt: skip
        self.fc = nn.Linear(32, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x).amax(dim=-1))


def audio_cnn(**_: Any) -> nn.Module:
    model = AudioCNN()
    return _widened(model, model.fc)


class PooledCNN(nn.Module):
    """A keyword-spotting CNN over a 40-band x 49-frame spectrogram: average pooling between
    convolutions (padded, ceil_mode, count_include_pad=False; then a plain 2x2 and a 1-d
    pooling over time), a mean over frequency and a max over time."""

    def __init__(self, classes: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_act(1, 16),
            nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
            _conv_bn_act(16, 32),
            nn.AvgPool2d(2),
        )
        self.temporal = nn.Sequential(
            nn.Conv1d(32, 32, 3, padding=1), nn.BatchNorm1d(32), nn.ReLU()
        )
        self.fc = nn.Linear(32, classes)

    def forward(self, x: Tensor) -> Tensor:
        frames = self.temporal(self.features(x).mean(2))  # [N, 32, T]
        frames = nn.functional.avg_pool1d(frames, 3, stride=1, padding=1)
        return self.fc(frames.amax(dim=-1))


def pooled_cnn(**_: Any) -> nn.Module:
    model = PooledCNN()
    return _widened(model, model.fc)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, reduced, 1), nn.Conv2d(reduced, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))


class MBConv(nn.Module):
    """EfficientNet's block: 1x1 expand, depthwise 3x3, squeeze-and-excite, 1x1 project."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(
            _conv_bn_act(cin, mid, 1, act=nn.SiLU),
            _conv_bn_act(mid, mid, 3, stride, groups=mid, act=nn.SiLU),
            SqueezeExcite(mid, max(1, cin // 4)),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class EfficientNetStyle(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = _conv_bn_act(3, 16, 3, 2, act=nn.SiLU)
        self.blocks = nn.Sequential(MBConv(16, 16, 1), MBConv(16, 24, 2), MBConv(24, 24, 1))
        self.head = _conv_bn_act(24, 64, 1, act=nn.SiLU)
        self.fc = nn.Linear(64, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))


def efficientnet_style(**_: Any) -> nn.Module:
    model = EfficientNetStyle()
    return _widened(model, model.fc)


class DSCNN(nn.Module):
    """Keyword spotting's depthwise-separable CNN over 49 frames x 10 MFCCs."""

    def __init__(self, classes: int = 12, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, (10, 4), stride=(2, 2), padding=(5, 1), bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        layers = []
        for _ in range(4):
            layers += [_conv_bn_act(width, width, 3, groups=width), _conv_bn_act(width, width, 1)]
        self.body = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.body(self.stem(x))).flatten(1))


def ds_cnn(**_: Any) -> nn.Module:
    model = DSCNN()
    return _widened(model, model.fc)


class RecurrentTagger(nn.Module):
    """A sequence tagger over 12 features a step: a 2-layer bidirectional GRU or LSTM
    (batch first), then per-step logits."""

    def __init__(self, cell: type[nn.Module], classes: int = 5) -> None:
        super().__init__()
        self.rnn = cell(12, 16, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(32, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.rnn(x)[0])


def gru_tagger(**_: Any) -> nn.Module:
    model = RecurrentTagger(nn.GRU)
    return _widened(model, model.head)


def lstm_tagger(**_: Any) -> nn.Module:
    model = RecurrentTagger(nn.LSTM)
    return _widened(model, model.head, gain=8.0)


class XnnpackOps(nn.Module):
    """Every op kind the XNNPACK delegate takes beyond MobileNetV2's: max and average pooling,
    hardswish, sigmoid gating (a tensor multiply), subtract and divide by constants, constant
    padding, a global mean, fully connected layers, ReLU and softmax."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, groups=16)
        self.conv3 = nn.Conv2d(16, 32, 1)
        self.register_buffer("offset", torch.linspace(-0.5, 0.5, 32).reshape(32, 1, 1))
        self.fc1 = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, classes)

    def forward(self, x: Tensor) -> Tensor:
        f = nn.functional
        y = f.max_pool2d(torch.relu(self.conv1(x)), 2)
        y = f.hardswish(self.conv2(f.pad(y, (1, 1, 1, 1), value=0.25)))
        y = f.avg_pool2d(self.conv3(y), 2)
        y = (y * torch.sigmoid(y) - self.offset) / 0.5
        y = torch.relu(self.fc1(y.mean((2, 3))))
        return torch.softmax(self.fc2(y) * 4.0, dim=-1)


def xnnpack_ops(**_: Any) -> nn.Module:
    model = XnnpackOps()
    return _widened(model, model.fc2)


class MixedDelegate(nn.Module):
    """Convolutions XNNPACK runs around ops it does not (a transposed convolution, a group
    norm), each big enough for the runtime's kernels to split: with +partitioner=xnnpack the
    method alternates between delegate calls and the runtime's own kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.norm = nn.GroupNorm(4, 16)
        self.head = nn.Conv2d(16, 24, 3, stride=2, padding=1)
        self.fc = nn.Linear(24, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.up(torch.relu(self.stem(x))))
        return self.fc(torch.relu(self.head(x)).mean((2, 3)))


def mixed_delegate(**_: Any) -> nn.Module:
    torch.manual_seed(3)
    return MixedDelegate().eval()
