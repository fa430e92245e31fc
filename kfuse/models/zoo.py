"""Model registry: named models built from configs with seeded random weights (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import bert, gpt2, llama, mlp, repvgg, resnet, vit


@dataclass(frozen=True)
class ModelSpec:
    name: str  # "bert-base"
    family: str  # "bert" | "gpt2" | "llama" | "vit" | "resnet" | "mlp" | "repvgg"
    description: str
    default_batch: int
    default_seq: int | None  # None for image/MLP models


@dataclass(frozen=True)
class _Entry:
    spec: ModelSpec
    factory: Callable[[str], torch.nn.Module]  # fp32 model on CPU, called after torch.manual_seed
    input_shape: tuple[int, ...] | None  # per-sample float input shape; None for token models
    vocab_size: int | None = None  # token models only
    max_seq: int | None = None  # token models only (position-embedding table size)


def _tok(
    name: str, family: str, desc: str, batch: int, seq: int, factory: Callable[[str], torch.nn.Module], vocab: int, max_seq: int
) -> _Entry:
    return _Entry(ModelSpec(name, family, desc, batch, seq), factory, None, vocab, max_seq)


def _dense(name: str, family: str, desc: str, batch: int, factory: Callable[[str], torch.nn.Module], shape: tuple[int, ...]) -> _Entry:
    return _Entry(ModelSpec(name, family, desc, batch, None), factory, shape)


def _img(n: int) -> tuple[int, int, int]:
    return (3, n, n)


_REGISTRY: dict[str, _Entry] = {
    e.spec.name: e
    for e in [
        _tok(
            "bert-base",
            "bert",
            "HF BertModel: 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522",
            32,
            128,
            bert.build_bert,
            30522,
            512,
        ),
        _tok("bert-tiny", "bert", "HF BertModel: 2 layers, hidden 128, 2 heads, FFN 512, vocab 512", 8, 64, bert.build_bert, 512, 512),
        _tok("gpt2-small", "gpt2", "HF GPT2Model: 12 layers, hidden 768, 12 heads, vocab 50257", 16, 128, gpt2.build_gpt2, 50257, 1024),
        _tok("gpt2-tiny", "gpt2", "HF GPT2Model: 2 layers, hidden 128, 2 heads, vocab 512", 8, 64, gpt2.build_gpt2, 512, 512),
        _tok(
            "llama-1b",
            "llama",
            "HF LlamaModel, TinyLlama-1.1B shape: 22 layers, hidden 2048, 32 heads / 4 KV heads (GQA), SiLU MLP 5632, vocab 32000",
            1,
            512,
            llama.build_llama,
            32000,
            2048,
        ),
        _tok(
            "llama-tiny",
            "llama",
            "HF LlamaModel: 2 layers, hidden 128, 4 heads / 2 KV heads (GQA), SiLU MLP 256, vocab 512",
            8,
            64,
            llama.build_llama,
            512,
            512,
        ),
        _dense(
            "vit-b16",
            "vit",
            "HF ViTModel ViT-B/16: 224x224, 12 layers, hidden 768, 12 heads, no pooler",
            32,
            vit.build_vit,
            _img(vit.image_size("vit-b16")),
        ),
        _dense(
            "vit-ti16",
            "vit",
            "HF ViTModel ViT-Ti/16 (DeiT-Tiny): 224x224, 12 layers, hidden 192, 3 heads, MLP 768, no pooler",
            64,
            vit.build_vit,
            _img(vit.image_size("vit-ti16")),
        ),
        _dense(
            "vit-tiny",
            "vit",
            "HF ViTModel: 32x32, patch 8, 2 layers, hidden 64, 2 heads, no pooler",
            8,
            vit.build_vit,
            _img(vit.image_size("vit-tiny")),
        ),
        _dense(
            "resnet50",
            "resnet",
            "torchvision-equivalent ResNet-50 (Bottleneck [3,4,6,3]), 224x224, 1000 classes",
            32,
            resnet.build_resnet,
            _img(resnet.image_size("resnet50")),
        ),
        _dense(
            "resnet-tiny",
            "resnet",
            "ResNet with Bottleneck [1,1,1,1], base width 16, 32x32, 10 classes",
            8,
            resnet.build_resnet,
            _img(resnet.image_size("resnet-tiny")),
        ),
        _dense("mlp-tiny", "mlp", "3-layer MLP 64->128 (GELU) ->128 (ReLU) ->32", 32, mlp.build_mlp, mlp.INPUT_SHAPES["mlp-tiny"]),
        _dense(
            "nerf-mlp",
            "mlp",
            "NeRF-style MLP: 8x Linear(256)+ReLU on 63 features, 4 outputs, no skip; batch = rays",
            65536,
            mlp.build_mlp,
            mlp.INPUT_SHAPES["nerf-mlp"],
        ),
        _dense(
            "mixer-tiny",
            "mlp",
            "MLP-Mixer: 32x32, patch 4 (64 tokens), dim 64, 2 blocks, 10 classes",
            8,
            mlp.build_mlp,
            mlp.INPUT_SHAPES["mixer-tiny"],
        ),
        _dense(
            "repvgg-tiny",
            "repvgg",
            "RepVGG-style 3x3 conv->ReLU->1x1 conv residual blocks, widths 16/32/64, 32x32",
            8,
            repvgg.build_repvgg,
            _img(32),
        ),
    ]
}


def list_models() -> list[ModelSpec]:
    """All registered models, in registry order."""
    return [e.spec for e in _REGISTRY.values()]


def get_spec(name: str) -> ModelSpec:
    """Spec for ``name``; KeyError listing the known names if unknown."""
    try:
        return _REGISTRY[name].spec
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(_REGISTRY)}") from None


def _mask_lengths(batch: int, seq: int, ratio: float, gen: torch.Generator) -> torch.Tensor:
    """Per-row valid lengths in [1, seq] whose mean is ``ratio * seq`` (exact up to integer rounding)."""
    target = ratio * seq
    half = max(0.0, min(target - 1.0, seq - target))  # symmetric uniform spread that stays in [1, seq]
    lens = (target + (torch.rand(batch, generator=gen, dtype=torch.float64) * 2 - 1) * half).round().clamp(1, seq).long()
    # nudge rows by +-1 until the total hits round(target * batch)
    diff = round(target * batch) - int(lens.sum())
    i = 0
    while diff != 0 and i < 4 * batch * seq:
        r = i % batch
        if diff > 0 and lens[r] < seq:
            lens[r] += 1
            diff -= 1
        elif diff < 0 and lens[r] > 1:
            lens[r] -= 1
            diff += 1
        i += 1
    return lens


def build(
    name: str,
    *,
    batch: int | None = None,
    seq: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    with_mask: bool = False,
    avg_len_ratio: float | None = None,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """Build ``name`` with seeded random weights; returns (eval model on device/dtype, positional args, keyword args).

    Token models take ``input_ids`` (int64, (batch, seq)) positionally and, with ``with_mask``, an ``attention_mask``
    keyword (int64, ones then zeros per row, mean valid length ``avg_len_ratio * seq``, default 0.6). Other models take
    one float input; ``seq`` is ignored for them, and ``with_mask``/``avg_len_ratio`` are rejected.
    """
    spec = get_spec(name)
    entry = _REGISTRY[name]
    batch = spec.default_batch if batch is None else batch
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if avg_len_ratio is not None and not with_mask:
        raise ValueError("avg_len_ratio needs with_mask=True")

    torch.manual_seed(seed)
    model = entry.factory(name).to(device=device, dtype=dtype).eval()

    gen = torch.Generator().manual_seed(seed + 1)  # inputs: CPU generator, independent of the device
    kwargs: dict[str, torch.Tensor] = {}
    if entry.input_shape is None:  # token model
        seq = spec.default_seq if seq is None else seq
        assert entry.vocab_size is not None and entry.max_seq is not None
        if not 1 <= seq <= entry.max_seq:
            raise ValueError(f"{name}: seq must be in [1, {entry.max_seq}], got {seq}")
        ids = torch.randint(0, entry.vocab_size, (batch, seq), generator=gen, dtype=torch.int64)
        args: tuple[torch.Tensor, ...] = (ids.to(device),)
        if with_mask:
            ratio = 0.6 if avg_len_ratio is None else avg_len_ratio
            if not 0.0 < ratio <= 1.0:
                raise ValueError(f"avg_len_ratio must be in (0, 1], got {ratio}")
            lens = _mask_lengths(batch, seq, ratio, gen)
            mask = (torch.arange(seq).unsqueeze(0) < lens.unsqueeze(1)).to(torch.int64)
            kwargs["attention_mask"] = mask.to(device)
    else:
        if with_mask:
            raise ValueError(f"{name} is not a token model; with_mask is not supported")
        x = torch.randn((batch, *entry.input_shape), generator=gen, dtype=torch.float32)
        args = (x.to(device=device, dtype=dtype),)
    return model, args, kwargs
