"""ResNet family: a torchvision-equivalent ResNet (v1.5, stride in the 3x3 conv) with Bottleneck blocks.

Module names and parameter shapes match ``torchvision.models.resnet50`` so state dicts are interchangeable.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (strided) -> 1x1 expand, each with BN; residual add then ReLU."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision-style ResNet: 7x7/2 stem conv, BN, ReLU, 3x3/2 maxpool, 4 stages, adaptive avgpool, fc."""

    def __init__(self, layers: list[int], num_classes: int = 1000, base_width: int = 64) -> None:
        super().__init__()
        self.inplanes = base_width
        self.conv1 = nn.Conv2d(3, base_width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(base_width, layers[0])
        self.layer2 = self._make_layer(base_width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(base_width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(base_width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(base_width * 8 * Bottleneck.expansion, num_classes)
        self._init_weights()

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * Bottleneck.expansion, stride), nn.BatchNorm2d(planes * Bottleneck.expansion)
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    @torch.no_grad()
    def _init_weights(self) -> None:
        # torchvision's kaiming init for convs; BN gets random affine params and running stats so that
        # folding BN into the conv is a real (non-identity) transform. The last BN of each block is scaled
        # down (like a soft zero_init_residual) to keep activations bounded through the residual stack.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
        for m in self.modules():
            if isinstance(m, Bottleneck):
                m.bn3.weight.mul_(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# name -> (layers, num_classes, base_width, input image size)
CONFIGS: dict[str, tuple[list[int], int, int, int]] = {
    "resnet50": ([3, 4, 6, 3], 1000, 64, 224),
    "resnet-tiny": ([1, 1, 1, 1], 10, 16, 32),
}


def image_size(name: str) -> int:
    return CONFIGS[name][3]


def build_resnet(name: str) -> nn.Module:
    layers, num_classes, base_width, _ = CONFIGS[name]
    return ResNet(layers, num_classes=num_classes, base_width=base_width)
