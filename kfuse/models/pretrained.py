"""A local Hugging Face checkpoint (a directory with ``config.json`` and weights, as
``save_pretrained`` writes it) as a model with example inputs, for ``kfuse compile DIR``.

Nothing is downloaded: ``transformers`` loads the directory with ``local_files_only``. The example
inputs follow the model's ``main_input_name``: random token ids within the vocabulary for
``input_ids`` (with an attention mask when asked), random images of the configured size for
``pixel_values``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class PretrainedLoadError(ValueError):
    """The directory is not a checkpoint kfuse can load, or its inputs cannot be made; says why."""


def is_checkpoint(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def load_pretrained(
    path: str | Path,
    *,
    batch: int | None = None,
    seq: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    with_mask: bool = False,
    seed: int = 0,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """(eval model on ``device`` in ``dtype``, positional args, keyword args) for the checkpoint at
    ``path``. Token models get ``batch x seq`` ids (defaults 1 x 128, at most the position table),
    and with ``with_mask`` an all-ones ``attention_mask``; vision models ``batch`` images."""
    try:
        from transformers import AutoModel
    except ImportError as e:  # pragma: no cover - transformers is a dependency of the models extra
        raise PretrainedLoadError("loading a Hugging Face checkpoint needs transformers (pip install kfuse[models])") from e
    if not is_checkpoint(path):
        raise PretrainedLoadError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
    try:
        # no dtype argument: its name changed across transformers versions (torch_dtype, dtype); cast after
        model = AutoModel.from_pretrained(str(path), local_files_only=True, attn_implementation="sdpa")
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the message is what matters
        raise PretrainedLoadError(f"{path}: transformers could not load it: {type(e).__name__}: {e}") from e
    model = model.to(device=device, dtype=dtype).eval()
    cfg = model.config
    batch = 1 if batch is None else batch
    gen = torch.Generator().manual_seed(seed)
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        vocab = getattr(cfg, "vocab_size", None)
        if not vocab:
            raise PretrainedLoadError(f"{path}: a token model without vocab_size in its config")
        limit = getattr(cfg, "max_position_embeddings", None) or 1 << 30
        seq = min(128 if seq is None else seq, limit)
        ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
        kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids)} if with_mask else {}
        return model, (ids,), kwargs
    if name == "pixel_values":
        size = getattr(cfg, "image_size", None)
        if size is None:
            raise PretrainedLoadError(f"{path}: a vision model without image_size in its config")
        hw = tuple(size) if isinstance(size, list | tuple) else (size, size)
        chans = getattr(cfg, "num_channels", 3)
        x = torch.randn((batch, chans, *hw), generator=gen).to(device=device, dtype=dtype)
        return model, (x,), {}
    raise PretrainedLoadError(f"{path}: kfuse makes example inputs for input_ids and pixel_values models, not {name!r}")
