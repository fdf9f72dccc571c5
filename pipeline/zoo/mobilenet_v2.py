"""MobileNetV2 (Sandler et al. 2018), layer-for-layer equal to torchvision's."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of ``divisor`` without losing more than 10%."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNAct(nn.Sequential):
    """Conv2d(bias=False) + BatchNorm2d + optional activation, 'same' padding."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int = 1,
        groups: int = 1,
        activation: Callable[[], nn.Module] | None = nn.ReLU,
        bn_eps: float = 1e-5,
        bn_momentum: float = 0.1,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                stride,
                (kernel_size - 1) // 2,
                groups=groups,
                bias=False,
            ),
            nn.BatchNorm2d(out_channels, eps=bn_eps, momentum=bn_momentum),
        ]
        if activation is not None:
            layers.append(activation())
        super().__init__(*layers)
        self.out_channels = out_channels


def init_conv_bn(model: nn.Module) -> None:
    """torchvision-style init: kaiming-normal (fan_out) convs, zero biases, identity BN."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def init_classifier(model: nn.Module) -> None:
    """He-normal (fan_in) Linear weights, zero biases.

    torchvision uses normal(0, 0.01) or the nn.Linear default here; on random weights and
    inputs both give logits with std well below 0.1, this keeps them of order one.
    """
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(m.bias)


# expand ratio t, output channels c, repeats n, first stride s
_SETTING = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    """Expand 1x1 -> depthwise 3x3 -> linear project 1x1, residual when shapes match."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNAct(inp, hidden, 1, activation=nn.ReLU6))
        layers += [
            ConvBNAct(hidden, hidden, 3, stride=stride, groups=hidden, activation=nn.ReLU6),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 classifier; input [N, 3, H, W] float, output [N, num_classes] logits."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0) -> None:
        super().__init__()
        input_channel = make_divisible(32 * width_mult)
        last_channel = make_divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [ConvBNAct(3, input_channel, 3, stride=2, activation=nn.ReLU6)]
        for t, c, n, s in _SETTING:
            output_channel = make_divisible(c * width_mult)
            for i in range(n):
                stride = s if i == 0 else 1
                features.append(InvertedResidual(input_channel, output_channel, stride, t))
                input_channel = output_channel
        features.append(ConvBNAct(input_channel, last_channel, 1, activation=nn.ReLU6))
        self.features = nn.Sequential(*features)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.2), nn.Linear(last_channel, num_classes))
        init_conv_bn(self)
        init_classifier(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        x = self.avgpool(x).flatten(1)
        return self.classifier(x)


def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0) -> nn.Module:
    """Build a randomly initialised MobileNetV2 (3,504,872 params at width 1.0, 1000 classes)."""
    return MobileNetV2(num_classes=num_classes, width_mult=width_mult)
