"""MobileNetV3-Small (Howard et al. 2019), layer-for-layer equal to torchvision's."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

from torch import Tensor, nn

from .mobilenet_v2 import ConvBNAct, init_classifier, init_conv_bn, make_divisible

_BN_EPS = 1e-3
_BN_MOMENTUM = 0.01


class _Block(NamedTuple):
    in_ch: int
    kernel: int
    expanded: int
    out_ch: int
    use_se: bool
    use_hs: bool
    stride: int


# The standard MobileNetV3-Small bneck table (width 1.0, dilation 1).
_SMALL = (
    _Block(16, 3, 16, 16, True, False, 2),
    _Block(16, 3, 72, 24, False, False, 2),
    _Block(24, 3, 88, 24, False, False, 1),
    _Block(24, 5, 96, 40, True, True, 2),
    _Block(40, 5, 240, 40, True, True, 1),
    _Block(40, 5, 240, 40, True, True, 1),
    _Block(40, 5, 120, 48, True, True, 1),
    _Block(48, 5, 144, 48, True, True, 1),
    _Block(48, 5, 288, 96, True, True, 2),
    _Block(96, 5, 576, 96, True, True, 1),
    _Block(96, 5, 576, 96, True, True, 1),
)


class SqueezeExcitation(nn.Module):
    """Global average pool -> 1x1 conv -> ReLU -> 1x1 conv -> hardsigmoid -> channel scale."""

    def __init__(self, channels: int, squeeze_channels: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x: Tensor) -> Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidual(nn.Module):
    """MobileNetV3 bneck: optional expand, depthwise, optional SE, linear project."""

    def __init__(self, cfg: _Block) -> None:
        super().__init__()
        conv = partial(ConvBNAct, bn_eps=_BN_EPS, bn_momentum=_BN_MOMENTUM)
        act = nn.Hardswish if cfg.use_hs else nn.ReLU
        self.use_res_connect = cfg.stride == 1 and cfg.in_ch == cfg.out_ch
        layers: list[nn.Module] = []
        if cfg.expanded != cfg.in_ch:
            layers.append(conv(cfg.in_ch, cfg.expanded, 1, activation=act))
        layers.append(
            conv(
                cfg.expanded,
                cfg.expanded,
                cfg.kernel,
                stride=cfg.stride,
                groups=cfg.expanded,
                activation=act,
            )
        )
        if cfg.use_se:
            layers.append(SqueezeExcitation(cfg.expanded, make_divisible(cfg.expanded // 4)))
        layers.append(conv(cfg.expanded, cfg.out_ch, 1, activation=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        if self.use_res_connect:
            return x + self.block(x)
        return self.block(x)


class MobileNetV3(nn.Module):
    """MobileNetV3 classifier; input [N, 3, H, W] float, output [N, num_classes] logits."""

    def __init__(
        self, blocks: tuple[_Block, ...], last_channel: int, num_classes: int = 1000
    ) -> None:
        super().__init__()
        conv = partial(ConvBNAct, bn_eps=_BN_EPS, bn_momentum=_BN_MOMENTUM)
        layers: list[nn.Module] = [conv(3, blocks[0].in_ch, 3, stride=2, activation=nn.Hardswish)]
        layers += [InvertedResidual(cfg) for cfg in blocks]
        lastconv_in = blocks[-1].out_ch
        lastconv_out = 6 * lastconv_in
        layers.append(conv(lastconv_in, lastconv_out, 1, activation=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(lastconv_out, last_channel),
            nn.Hardswish(),
            nn.Dropout(p=0.2),
            nn.Linear(last_channel, num_classes),
        )
        init_conv_bn(self)
        init_classifier(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x).flatten(1)
        return self.classifier(x)


def mobilenet_v3_small(num_classes: int = 1000) -> nn.Module:
    """Build a randomly initialised MobileNetV3-Small (2,542,856 params at 1000 classes)."""
    return MobileNetV3(_SMALL, last_channel=1024, num_classes=num_classes)
