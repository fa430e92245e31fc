"""MLP family: a tiny MLP, a NeRF-style MLP, and a tiny MLP-Mixer."""

from __future__ import annotations

import torch
from torch import nn


class TinyMLP(nn.Module):
    """64 -> 128 (GELU) -> 128 (ReLU) -> 32."""

    def __init__(self, d_in: int = 64, d_hidden: int = 128, d_out: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act1 = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.act2 = nn.ReLU()
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


class NeRFMLP(nn.Module):
    """NeRF-style trunk: 8 Linear+ReLU layers of width 256 on 63 positional-encoding features, then a
    linear head to 4 outputs (rgb + sigma). Simplified: no skip concat at layer 4 and no view-direction branch."""

    def __init__(self, d_in: int = 63, width: int = 256, depth: int = 8, d_out: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(d_in if i == 0 else width, width), nn.ReLU()]
        self.trunk = nn.Sequential(*layers)
        self.head = nn.Linear(width, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))


class MixerBlock(nn.Module):
    """MLP-Mixer block: LN -> token-mixing MLP (over patches) + residual; LN -> channel MLP + residual."""

    def __init__(self, num_tokens: int, dim: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(num_tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, num_tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, tokens, dim)
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class TinyMixer(nn.Module):
    """32x32 image, 4x4 patches (64 tokens), dim 64, 2 Mixer blocks, mean-pool, 10-way head."""

    def __init__(
        self,
        image_size: int = 32,
        patch: int = 4,
        dim: int = 64,
        depth: int = 2,
        token_hidden: int = 32,
        channel_hidden: int = 128,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        num_tokens = (image_size // patch) ** 2
        self.stem = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock(num_tokens, dim, token_hidden, channel_hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)  # (B, tokens, dim)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


# name -> input shape without the batch dim
INPUT_SHAPES: dict[str, tuple[int, ...]] = {"mlp-tiny": (64,), "nerf-mlp": (63,), "mixer-tiny": (3, 32, 32)}


def build_mlp(name: str) -> nn.Module:
    if name == "mlp-tiny":
        return TinyMLP()
    if name == "nerf-mlp":
        return NeRFMLP()
    if name == "mixer-tiny":
        return TinyMixer()
    raise KeyError(name)
