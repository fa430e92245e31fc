"""Llama family: HF transformers ``LlamaModel`` built from a config (random weights, no downloads).

The decoder-only shape most deployed models share: RMSNorm, rotary position embeddings,
grouped-query attention (fewer key/value heads than query heads) and a SiLU-gated MLP.
"""

from __future__ import annotations

from typing import Any

import torch

# llama-1b has TinyLlama-1.1B's architecture (22 layers, hidden 2048, 32 query / 4 key-value heads,
# MLP 5632, vocab 32000); llama-tiny is the same structure at test size (GQA kept: 4 / 2 heads).
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-1b": dict(
        vocab_size=32000,
        hidden_size=2048,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        intermediate_size=5632,
        max_position_embeddings=2048,
    ),
    "llama-tiny": dict(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
    ),
}


def build_llama(name: str) -> torch.nn.Module:
    """Build an fp32 ``LlamaModel`` (no LM head) with SDPA attention and ``use_cache=False``: a
    prefill without a KV cache in the outputs, as the zoo's GPT-2. (A model that returns its
    ``DynamicCache`` compiles too; ``tests/frontend/test_hf_decoders.py``.)"""
    from transformers import LlamaConfig, LlamaModel  # lazy: transformers is an optional dependency

    cfg = LlamaConfig(**CONFIGS[name], use_cache=False, attn_implementation="sdpa")
    return LlamaModel(cfg)
