"""GPT-2 family: HF transformers ``GPT2Model`` built from a config (random weights, no downloads)."""

from __future__ import annotations

from typing import Any

import torch

# gpt2-small keeps the real vocab; gpt2-tiny uses a small one (bos/eos moved inside it).
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2-small": dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024),
    "gpt2-tiny": dict(vocab_size=512, n_embd=128, n_layer=2, n_head=2, n_positions=512, bos_token_id=511, eos_token_id=511),
}


def build_gpt2(name: str) -> torch.nn.Module:
    """Build an fp32 ``GPT2Model`` with SDPA attention and ``use_cache=False`` (no KV cache in the outputs)."""
    from transformers import GPT2Config, GPT2Model  # lazy: transformers is an optional dependency

    cfg = GPT2Config(**CONFIGS[name], use_cache=False, attn_implementation="sdpa")
    return GPT2Model(cfg)
