"""The baselines' Hugging Face mask fix (kfuse/bench/hf_masks.py): under capture or compile (simulated
here by making transformers believe it is tracing) a model given no padding mask hands SDPA no mask,
as in eager; a model given one is untouched; the patch is undone on exit."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

mu = pytest.importorskip("transformers.masking_utils")

from kfuse.bench.hf_masks import hf_masks_skipped_when_absent  # noqa: E402
from kfuse.models import zoo  # noqa: E402


def _sdpa_masks(model: torch.nn.Module, args: tuple, kwargs: dict) -> list[object]:
    """The attn_mask argument of every SDPA call of one forward, with transformers tracing."""
    seen: list[object] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*a: object, **k: object) -> torch.Tensor:
        seen.append(k.get("attn_mask", a[3] if len(a) > 3 else None))
        return real(*a, **k)

    with (
        mock.patch.object(mu, "is_tracing", lambda *a, **k: True),
        mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", spy),
        torch.no_grad(),
    ):
        model(*args, **kwargs)
    return seen


def test_stock_transformers_builds_a_mask_when_tracing() -> None:
    m, a, kw = zoo.build("bert-tiny", batch=2, seq=16)
    masks = _sdpa_masks(m, a, kw)
    assert masks and all(isinstance(x, torch.Tensor) for x in masks)  # the behaviour the fix exists for


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "llama-tiny", "vit-tiny"])
def test_no_mask_is_built_when_the_model_got_none(name: str) -> None:
    m, a, kw = zoo.build(name, batch=2, seq=16)
    with torch.no_grad():
        ref = m(*a, **kw).last_hidden_state
    with hf_masks_skipped_when_absent() as patched:
        assert patched == ["_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa", "find_packed_sequence_indices"]
        masks = _sdpa_masks(m, a, kw)
        with torch.no_grad():
            out = m(*a, **kw).last_hidden_state
    assert masks and all(x is None for x in masks)
    torch.testing.assert_close(out, ref)


def test_a_padding_mask_is_left_alone() -> None:
    m, a, kw = zoo.build("bert-tiny", batch=2, seq=16, with_mask=True)
    assert int(kw["attention_mask"].sum()) < kw["attention_mask"].numel()  # some padding
    with hf_masks_skipped_when_absent():
        masks = _sdpa_masks(m, a, kw)
    assert masks and all(isinstance(x, torch.Tensor) for x in masks)


def test_causal_answers_follow_eager() -> None:
    with mock.patch.object(mu, "is_tracing", lambda *a, **k: True), hf_masks_skipped_when_absent():
        assert mu._ignore_causal_mask_sdpa(None, 8, 8, 0, 0)  # square: SDPA's is_causal
        assert mu._ignore_causal_mask_sdpa(None, 1, 8, 7, 0)  # one query row
        assert not mu._ignore_causal_mask_sdpa(None, 4, 8, 4, 0)  # a chunk after a cache: needs the mask
        assert not mu._ignore_causal_mask_sdpa(None, 8, 8, 0, 0, 4)  # a sliding window shorter than the keys
        assert not mu._ignore_bidirectional_mask_sdpa(None, 8, 4)
        assert not mu._ignore_bidirectional_mask_sdpa(torch.ones(2, 8, dtype=torch.bool), 8)  # tracing: can't look


def test_the_patch_is_undone_on_exit() -> None:
    names = ("_ignore_bidirectional_mask_sdpa", "_ignore_causal_mask_sdpa", "find_packed_sequence_indices")
    before = tuple(getattr(mu, n) for n in names)
    with pytest.raises(RuntimeError), hf_masks_skipped_when_absent():
        assert mu._ignore_bidirectional_mask_sdpa is not before[0]
        raise RuntimeError("a baseline failed")
    assert tuple(getattr(mu, n) for n in names) == before


def test_packed_rows_are_still_found_in_eager() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0]])
    with hf_masks_skipped_when_absent():
        found = mu.find_packed_sequence_indices(pos)
        with mock.patch.object(mu, "is_tracing", lambda *a, **k: True):
            traced = mu.find_packed_sequence_indices(pos)
    assert found.tolist() == [[0, 0, 0, 1, 1, 1, 1, 2]]
    assert traced is None
