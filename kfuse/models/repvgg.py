"""RepVGG-style family (inference form, BN already folded into conv biases).

Each block is a 3x3 conv -> ReLU -> 1x1 conv chain with a residual add and ReLU: the back-to-back
conv pattern that a fusion compiler should keep on-chip.
"""

from __future__ import annotations

import torch
from torch import nn


class RepBlock(nn.Module):
    """y = relu(conv1x1(relu(conv3x3(x))) + x)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv3x3 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=True)
        self.relu1 = nn.ReLU()
        self.conv1x1 = nn.Conv2d(channels, channels, kernel_size=1, bias=True)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu2(self.conv1x1(self.relu1(self.conv3x3(x))) + x)


class RepVGGTiny(nn.Module):
    """32x32 input; stem 3x3 conv (3->16); stages of width 16/32/64 (stride-2 3x3 transition conv between stages),
    2 RepBlocks each; global avgpool; 10-way fc."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 2, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], kernel_size=3, padding=1), nn.ReLU())
        stages: list[nn.Module] = []
        cin = widths[0]
        for i, w in enumerate(widths):
            mods: list[nn.Module] = []
            if i > 0:
                mods += [nn.Conv2d(cin, w, kernel_size=3, stride=2, padding=1), nn.ReLU()]
            mods += [RepBlock(w) for _ in range(blocks)]
            stages.append(nn.Sequential(*mods))
            cin = w
        self.stages = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, RepBlock):
                # keep the residual stack well-scaled: the 1x1 branch starts small
                with torch.no_grad():
                    m.conv1x1.weight.mul_(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_repvgg(name: str) -> nn.Module:
    if name == "repvgg-tiny":
        return RepVGGTiny()
    raise KeyError(name)
