"""ViT family: HF transformers ``ViTModel`` (no pooling layer) built from a config."""

from __future__ import annotations

from typing import Any

import torch

CONFIGS: dict[str, dict[str, Any]] = {
    # ViT-B/16 at 224x224 (HF ViTConfig defaults, spelled out)
    "vit-b16": dict(
        image_size=224, patch_size=16, num_channels=3, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    ),
    # DeiT-Ti / ViT-Ti/16 (Touvron et al. 2021): hidden 192, 3 heads, MLP 768. Its FFN (192 -> 768 -> 192)
    # is a two-GEMM chain with a 768-wide intermediate: b2b fuses it with chunked residence
    "vit-ti16": dict(
        image_size=224, patch_size=16, num_channels=3, hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768
    ),
    "vit-tiny": dict(
        image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256
    ),
}


def image_size(name: str) -> int:
    return int(CONFIGS[name]["image_size"])


def build_vit(name: str, **overrides: Any) -> torch.nn.Module:
    """Build an fp32 ``ViTModel(add_pooling_layer=False)`` with SDPA attention; ``overrides``
    replace config fields (e.g. fewer layers of the same widths for a quick test)."""
    from transformers import ViTConfig, ViTModel  # lazy: transformers is an optional dependency

    cfg = ViTConfig(**{**CONFIGS[name], **overrides}, attn_implementation="sdpa")
    return ViTModel(cfg, add_pooling_layer=False)
