"""Fair PyTorch baselines for Hugging Face transformers: no attention mask built where none was given.

Hugging Face transformers (5.x, ``masking_utils``) decides whether it can hand SDPA no mask at all
(``_ignore_bidirectional_mask_sdpa``, ``_ignore_causal_mask_sdpa``). In plain eager it can when the
model got no padding mask. Under CUDA-graph capture or ``torch.compile`` it never does: it cannot look
at a mask's values there, and it declines even when there is no mask to look at. It then builds an
all-true mask with ``expand`` (stride 0), which SDPA's fused kernels reject, so attention runs in
SDPA's math backend in FP32 (measured on the H200, session 25,
``experiments/s25_baseline_graph_probe.json``: ViT-B/16 B64 eager in a CUDA graph 18.2 ms against
6.7 ms eager).

Decoders (GPT-2, Llama) have a second check: with no mask and no cache, transformers looks for several
sequences packed in one row (``find_packed_sequence_indices``, from the position ids); under tracing it
cannot look, assumes they may be, and builds the mask for that.

A PyTorch user who knows this gets the fused kernel under capture too; the baselines should be that
user. ``hf_masks_skipped_when_absent`` makes the two skip functions answer "skip" when there is no
padding mask (what eager already answers) and, under tracing, reports no packed sequences (the
benchmarks never pack several sequences into one row; eager still runs the real check). Every call
with a padding mask is left as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

NOTE = (
    "HF transformers' mask skip applied under CUDA-graph capture and torch.compile when the model has no padding "
    "mask (kfuse/bench/hf_masks.py): without it both baselines ran attention in SDPA's FP32 math backend"
)


def _no_local_window(kv_length: int, local_attention_size: int | None) -> bool:
    return local_attention_size is None or kv_length < local_attention_size


def _bidirectional_skip(original: Any) -> Any:
    def skip(padding_mask: Any, kv_length: int, local_attention_size: int | None = None, *args: Any, **kwargs: Any) -> bool:
        if padding_mask is None and _no_local_window(kv_length, local_attention_size):
            return True
        return original(padding_mask, kv_length, local_attention_size, *args, **kwargs)

    return skip


def _causal_skip(original: Any) -> Any:
    def skip(
        padding_mask: Any, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
        local_attention_size: int | None = None, *args: Any, **kwargs: Any,
    ) -> bool:  # fmt: skip
        # eager's answer with no padding: SDPA's is_causal covers a square or single-row problem
        if padding_mask is None and _no_local_window(kv_length, local_attention_size) and (q_length == 1 or q_length == kv_length):
            return True
        return original(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size, *args, **kwargs)

    return skip


def _unpacked_when_tracing(original: Any, masking_utils: Any) -> Any:
    def find(position_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if masking_utils.is_tracing(position_ids):
            return None  # the benchmarks' rows hold one sequence each; eager below checks it for real
        return original(position_ids, *args, **kwargs)

    return find


@contextlib.contextmanager
def hf_masks_skipped_when_absent() -> Iterator[list[str]]:
    """While active, transformers skips building an attention mask the model was not given, under
    capture and compile as in eager, and takes every row to hold one sequence there. Yields the
    names it patched (empty without transformers, or where this version has none of them)."""
    try:
        from transformers import masking_utils as mu
    except ImportError:
        yield []
        return
    patches = {
        "_ignore_bidirectional_mask_sdpa": _bidirectional_skip,
        "_ignore_causal_mask_sdpa": _causal_skip,
        "find_packed_sequence_indices": lambda original: _unpacked_when_tracing(original, mu),
    }
    saved = {name: getattr(mu, name) for name in patches if hasattr(mu, name)}
    try:
        for name, original in saved.items():
            setattr(mu, name, patches[name](original))
        yield sorted(saved)
    finally:
        for name, original in saved.items():
            setattr(mu, name, original)
