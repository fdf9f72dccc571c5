"""ResNet-18 (He et al. 2015), layer-for-layer equal to torchvision's."""

from __future__ import annotations

from torch import Tensor, nn

from .mobilenet_v2 import init_classifier, init_conv_bn


class BasicBlock(nn.Module):
    """Two 3x3 conv+BN with a residual; 1x1 conv+BN downsample when the shape changes."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet with BasicBlocks; input [N, 3, H, W] float, output [N, num_classes] logits."""

    def __init__(self, layers: tuple[int, int, int, int], num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        stages: list[nn.Module] = []
        for i, blocks in enumerate(layers):
            planes = 64 * 2**i
            stage = [BasicBlock(inplanes, planes, 1 if i == 0 else 2)]
            stage += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        init_conv_bn(self)
        init_classifier(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x).flatten(1)
        return self.fc(x)


def resnet18(num_classes: int = 1000) -> nn.Module:
    """Build a randomly initialised ResNet-18 (11,689,512 params at 1000 classes)."""
    return ResNet((2, 2, 2, 2), num_classes=num_classes)
