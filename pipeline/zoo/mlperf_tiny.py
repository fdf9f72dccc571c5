"""The four MLPerf Tiny reference models (mlcommons/tiny, benchmark/training/*), in plain torch.

- ``ds_cnn``: keyword spotting, a 49x10 MFCC map in, 12 classes out;
- ``mobilenet_v1_vww``: visual wake words, MobileNetV1 at width 0.25 on 96x96 RGB, 2 classes;
- ``resnet8``: CIFAR-10 image classification, 32x32 RGB, 10 classes;
- ``fc_autoencoder``: anomaly detection, 640 log-mel features in, their reconstruction out.

Each follows its Keras reference layer for layer: the same layers, sizes, strides, biases
(Keras convolutions and dense layers have them, also before a batch norm) and batch-norm
placement (Keras' epsilon, 1e-3), so the parameter counts are the reference's. Two
differences, neither of which changes a shape or an operation count:

- Keras' ``padding='same'`` pads the extra row or column of a strided convolution at the
  bottom/right only; here the padding is symmetric, chosen to give the same output size
  (``same_padding``), so trained Keras weights would see their input shifted by one pixel.
- The classifiers end with logits: the reference's final softmax is left out, as in the rest
  of the zoo (it does not change the top-1 class).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from .mobilenet_v2 import init_classifier, init_conv_bn

_BN_EPS = 1e-3  # Keras' BatchNormalization default
_BN_MOMENTUM = 0.01  # Keras' momentum 0.99, in torch's convention


def same_padding(size: int, kernel: int, stride: int) -> int:
    """Symmetric padding that gives Keras' ``padding='same'`` output size, ceil(size / stride)."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return (total + 1) // 2


def batch_norm_2d(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=_BN_EPS, momentum=_BN_MOMENTUM)


def conv_bn_relu(
    in_channels: int,
    out_channels: int,
    kernel: int | tuple[int, int],
    stride: int = 1,
    padding: int | tuple[int, int] | None = None,
    groups: int = 1,
) -> nn.Sequential:
    """Keras' Conv2D (with bias) + BatchNormalization + ReLU; 'same' padding for odd kernels."""
    if padding is None:
        padding = (
            (kernel - 1) // 2 if isinstance(kernel, int) else tuple((k - 1) // 2 for k in kernel)
        )
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, stride, padding, groups=groups),
        batch_norm_2d(out_channels),
        nn.ReLU(),
    )


def depthwise_separable(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    """Depthwise 3x3 conv + BN + ReLU, then pointwise 1x1 conv + BN + ReLU."""
    return nn.Sequential(
        conv_bn_relu(in_channels, in_channels, 3, stride, groups=in_channels),
        conv_bn_relu(in_channels, out_channels, 1),
    )


class DSCNN(nn.Module):
    """Keyword-spotting DS-CNN (keyword_spotting/keras_model.py, 'ds_cnn').

    Input [N, 1, frames, coefficients] MFCCs (49x10); output [N, num_classes] logits.
    A 10x4 stride-2 conv (49x10 -> 25x5), four depthwise-separable blocks, then the
    reference's average pool of (frames // 2, coefficients // 2) = 24x5, which on a 25x5 map
    leaves out the last row, as the Keras model does.
    """

    def __init__(
        self,
        num_classes: int = 12,
        channels: int = 64,
        blocks: int = 4,
        frames: int = 49,
        coefficients: int = 10,
    ) -> None:
        super().__init__()
        padding = (same_padding(frames, 10, 2), same_padding(coefficients, 4, 2))
        self.stem = conv_bn_relu(1, channels, (10, 4), stride=2, padding=padding)
        self.stem_dropout = nn.Dropout(0.2)
        self.blocks = nn.Sequential(
            *(depthwise_separable(channels, channels) for _ in range(blocks))
        )
        self.dropout = nn.Dropout(0.4)
        self.avgpool = nn.AvgPool2d((frames // 2, coefficients // 2))
        self.classifier = nn.Linear(channels, num_classes)
        init_conv_bn(self)
        init_classifier(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.stem_dropout(self.stem(x)))
        x = self.avgpool(self.dropout(x)).flatten(1)
        return self.classifier(x)


# MobileNetV1's depthwise-separable layers at width 1.0: (output channels, depthwise stride).
_MOBILENET_V1 = (
    (64, 1),
    (128, 2),
    (128, 1),
    (256, 2),
    (256, 1),
    (512, 2),
    *((512, 1),) * 5,
    (1024, 2),
    (1024, 1),
)


class MobileNetV1(nn.Module):
    """MobileNetV1 (visual_wake_words/vww_model.py): input [N, 3, H, W], output [N, num_classes].

    A 3x3 stride-2 conv, 13 depthwise-separable layers, global average pool and a dense layer;
    ReLU (not ReLU6) after every batch norm, as in the reference. At width 0.25 the channels
    are 8, 16, 32, 32, 64, 64, 128 (x6), 256, 256; 96x96 in, 3x3 before the pool.
    """

    def __init__(self, num_classes: int = 2, width_mult: float = 0.25) -> None:
        super().__init__()
        channels = int(32 * width_mult)
        layers: list[nn.Module] = [conv_bn_relu(3, channels, 3, stride=2)]
        for out, stride in _MOBILENET_V1:
            layers.append(depthwise_separable(channels, int(out * width_mult), stride))
            channels = int(out * width_mult)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)  # the reference pools over the whole map
        self.classifier = nn.Linear(channels, num_classes)
        init_conv_bn(self)
        init_classifier(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.avgpool(self.features(x)).flatten(1)
        return self.classifier(x)


class ResidualStack(nn.Module):
    """Two 3x3 conv+BN with a residual and a ReLU after the add. When the shape changes the
    shortcut is a 1x1 strided conv without batch norm, as in the reference."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn_relu(in_channels, out_channels, 3, stride)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1)
        self.bn2 = batch_norm_2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        y = self.bn2(self.conv2(self.conv1(x)))
        return self.relu(self.shortcut(x) + y)


class ResNet8(nn.Module):
    """ResNet-8 for CIFAR-10 (image_classification/keras_model.py, resnet_v1_eembc).

    Input [N, 3, 32, 32]; output [N, num_classes] logits. A 3x3 conv (16 channels), three
    residual stacks of 16, 32 and 64 channels (the last two at stride 2), an 8x8 average pool
    and a dense layer.
    """

    def __init__(
        self, num_classes: int = 10, channels: tuple[int, int, int] = (16, 32, 64)
    ) -> None:
        super().__init__()
        self.stem = conv_bn_relu(3, channels[0], 3)
        stacks, width = [], channels[0]
        for i, c in enumerate(channels):
            stacks.append(ResidualStack(width, c, 1 if i == 0 else 2))
            width = c
        self.stacks = nn.Sequential(*stacks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)  # the reference's pool covers the 8x8 map
        self.classifier = nn.Linear(width, num_classes)
        init_conv_bn(self)
        init_classifier(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.avgpool(self.stacks(self.stem(x))).flatten(1)
        return self.classifier(x)


class FCAutoencoder(nn.Module):
    """Anomaly-detection autoencoder (anomaly_detection/keras_model.py).

    Input [N, 640] (5 frames of 128 log-mel bins); output [N, 640], its reconstruction.
    Dense + BatchNorm1d + ReLU layers of 128, 128, 128, 128, 8 (the bottleneck), 128, 128,
    128, 128 units, then a linear dense layer back to the input size.
    """

    def __init__(self, features: int = 640, hidden: int = 128, bottleneck: int = 8) -> None:
        super().__init__()
        widths = [hidden] * 4 + [bottleneck] + [hidden] * 4
        layers: list[nn.Module] = []
        width = features
        for w in widths:
            layers += [nn.Linear(width, w), nn.BatchNorm1d(w, eps=_BN_EPS, momentum=_BN_MOMENTUM)]
            layers.append(nn.ReLU())
            width = w
        layers.append(nn.Linear(width, features))
        self.layers = nn.Sequential(*layers)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                # He init keeps activations of order one through the ReLUs.
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


def ds_cnn(
    num_classes: int = 12, channels: int = 64, frames: int = 49, coefficients: int = 10
) -> nn.Module:
    """Build a randomly initialised DS-CNN: 23,756 parameters (Keras counts 24,908 with the
    batch norms' moving statistics)."""
    return DSCNN(num_classes, channels, frames=frames, coefficients=coefficients)


def mobilenet_v1_vww(num_classes: int = 2, width_mult: float = 0.25) -> nn.Module:
    """Build a randomly initialised MobileNetV1: 216,322 parameters at width 0.25 and 2 classes
    (Keras: 221,794)."""
    return MobileNetV1(num_classes, width_mult)


def resnet8(num_classes: int = 10) -> nn.Module:
    """Build a randomly initialised ResNet-8: 78,186 parameters at 10 classes (Keras: 78,666)."""
    return ResNet8(num_classes)


def fc_autoencoder(features: int = 640, hidden: int = 128, bottleneck: int = 8) -> nn.Module:
    """Build a randomly initialised autoencoder: 267,928 parameters (Keras: 269,992)."""
    return FCAutoencoder(features, hidden, bottleneck)
