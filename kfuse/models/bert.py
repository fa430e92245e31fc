"""BERT family: HF transformers ``BertModel`` built from a config (random weights, no downloads)."""

from __future__ import annotations

from typing import Any

import torch

# Architecture configs. bert-base keeps the real vocab; bert-tiny uses a small one.
CONFIGS: dict[str, dict[str, Any]] = {
    "bert-base": dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512
    ),
    "bert-tiny": dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512, max_position_embeddings=512
    ),
}


def build_bert(name: str) -> torch.nn.Module:
    """Build an fp32 ``BertModel`` (with pooler, as HF does by default) using SDPA attention."""
    from transformers import BertConfig, BertModel  # lazy: transformers is an optional dependency

    cfg = BertConfig(**CONFIGS[name], attn_implementation="sdpa")
    return BertModel(cfg)
