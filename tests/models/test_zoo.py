"""Model zoo: registry, determinism, example inputs, forward passes and torch.export of every model."""

from __future__ import annotations

import pytest
import torch

from kfuse.models import ModelSpec, build, get_spec, list_models

TINY = ["bert-tiny", "gpt2-tiny", "llama-tiny", "vit-tiny", "resnet-tiny", "mlp-tiny", "nerf-mlp", "mixer-tiny", "repvgg-tiny"]
BIG = ["bert-base", "gpt2-small", "llama-1b", "vit-b16", "vit-ti16", "resnet50"]
TOKEN = ["bert-base", "bert-tiny", "gpt2-small", "gpt2-tiny", "llama-1b", "llama-tiny"]


def _first(out: object) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]  # HF ModelOutput indexes like a tuple


def _small_kwargs(name: str) -> dict:
    # keep CPU tests fast: small batch everywhere, short sequences for token models
    return dict(batch=2, seq=16 if get_spec(name).default_seq else None)


def test_registry() -> None:
    specs = list_models()
    assert {s.name for s in specs} == set(TINY + BIG)
    fams = {s.name: s.family for s in specs}
    assert fams["bert-base"] == "bert" and fams["gpt2-tiny"] == "gpt2" and fams["vit-b16"] == "vit" and fams["llama-1b"] == "llama"
    assert fams["resnet50"] == "resnet" and fams["mixer-tiny"] == "mlp" and fams["repvgg-tiny"] == "repvgg"
    for s in specs:
        assert isinstance(s, ModelSpec) and s.description and s.default_batch >= 1
        assert (s.default_seq is not None) == (s.name in TOKEN)
    assert get_spec("bert-base").default_batch == 32 and get_spec("bert-base").default_seq == 128
    assert get_spec("nerf-mlp").default_batch == 65536


def test_unknown_name() -> None:
    with pytest.raises(KeyError, match="bert-base"):
        get_spec("bert-huge")
    with pytest.raises(KeyError):
        build("nope")


@pytest.mark.parametrize("name", TINY)
def test_tiny_build_run_export(name: str) -> None:
    model, args, kwargs = build(name, **_small_kwargs(name))
    assert not model.training and all(not m.training for m in model.modules())
    assert len(args) == 1 and args[0].shape[0] == 2
    with torch.no_grad():
        ref = _first(model(*args, **kwargs))
    assert torch.isfinite(ref).all() and ref.std() > 0
    ep = torch.export.export(model, args, kwargs, strict=False)
    with torch.no_grad():
        got = _first(ep.module()(*args, **kwargs))
    torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny", "llama-tiny"])
def test_token_inputs_and_masked_export(name: str) -> None:
    model, args, kwargs = build(name, batch=16, seq=32, with_mask=True, avg_len_ratio=0.5)
    (ids,) = args
    assert ids.dtype == torch.int64 and ids.shape == (16, 32) and 0 <= ids.min() and ids.max() < 512
    mask = kwargs["attention_mask"]
    assert mask.dtype == torch.int64 and mask.shape == (16, 32)
    lens = mask.sum(1)
    assert lens.min() >= 1
    assert abs(lens.float().mean().item() - 16.0) <= 0.5
    assert torch.equal(mask, (torch.arange(32) < lens[:, None]).long())  # ones then zeros
    with torch.no_grad():
        ref = _first(model(*args, **kwargs))
    ep = torch.export.export(model, args, kwargs, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(_first(ep.module()(*args, **kwargs)), ref)


def test_mask_defaults_and_errors() -> None:
    _, _, kw = build("bert-tiny", batch=64, seq=100, with_mask=True)
    assert abs(kw["attention_mask"].sum(1).float().mean().item() - 60.0) <= 0.5
    _, _, kw = build("bert-tiny", batch=4, seq=10, with_mask=True, avg_len_ratio=0.01)
    assert (kw["attention_mask"].sum(1) == 1).all()  # at least one valid token
    _, _, kw = build("bert-tiny", batch=4, seq=10)
    assert kw == {}
    with pytest.raises(ValueError):
        build("mlp-tiny", with_mask=True)
    with pytest.raises(ValueError):
        build("bert-tiny", seq=10_000)
    with pytest.raises(ValueError):
        build("bert-tiny", avg_len_ratio=0.5)


def test_seed_determinism() -> None:
    m0, a0, _ = build("resnet-tiny", seed=3)
    m1, a1, _ = build("resnet-tiny", seed=3)
    m2, a2, _ = build("resnet-tiny", seed=4)
    sd0, sd1, sd2 = m0.state_dict(), m1.state_dict(), m2.state_dict()
    assert all(torch.equal(sd0[k], sd1[k]) for k in sd0) and torch.equal(a0[0], a1[0])
    assert not torch.equal(sd0["conv1.weight"], sd2["conv1.weight"]) and not torch.equal(a0[0], a2[0])
    # BN is not an identity: random running stats and affine params
    bn = m0.bn1
    assert bn.running_mean.abs().sum() > 0 and not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    tm0, _, _ = build("bert-tiny", seed=1)
    tm1, _, _ = build("bert-tiny", seed=1)
    assert all(torch.equal(x, y) for x, y in zip(tm0.state_dict().values(), tm1.state_dict().values(), strict=True))


def test_dtype() -> None:
    model, args, kwargs = build("vit-tiny", batch=2, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters()) and args[0].dtype == torch.bfloat16
    with torch.no_grad():
        assert _first(model(*args)).dtype == torch.bfloat16
    model, args, _ = build("gpt2-tiny", batch=2, seq=8, dtype=torch.float16)
    assert args[0].dtype == torch.int64 and next(model.parameters()).dtype == torch.float16


def test_resnet50_matches_torchvision_layout() -> None:
    model, args, _ = build("resnet50", batch=1)
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision.models.resnet50
    sd = model.state_dict()
    assert sd["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
    assert sd["layer2.0.conv2.weight"].shape == (128, 128, 3, 3) and model.layer2[0].conv2.stride == (2, 2)  # v1.5
    assert [len(model.layer1), len(model.layer2), len(model.layer3), len(model.layer4)] == [3, 4, 6, 3]
    assert sd["fc.weight"].shape == (1000, 2048)
    with torch.no_grad():
        out = model(*args)
    assert out.shape == (1, 1000) and torch.isfinite(out).all()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,nparams,shape",
    [
        ("bert-base", 109_482_240, (1, 16, 768)),
        ("gpt2-small", 124_439_808, (1, 16, 768)),
        ("vit-b16", 85_798_656, (1, 197, 768)),
        ("vit-ti16", 5_524_416, (1, 197, 192)),
    ],
)
def test_big_hf_models(name: str, nparams: int, shape: tuple[int, ...]) -> None:
    model, args, kwargs = build(name, batch=1, seq=16 if name in TOKEN else None, with_mask=name in TOKEN)
    assert sum(p.numel() for p in model.parameters()) == nparams
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        out = _first(model(*args, **kwargs))
    assert out.shape == shape and torch.isfinite(out).all()


def test_llama_1b_has_tinyllama_shape() -> None:
    """The 1.1B benchmark model, built on the meta device (no memory, no time): TinyLlama-1.1B's
    parameter count without the LM head, GQA and the SiLU-gated MLP."""
    from kfuse.models.llama import build_llama

    with torch.device("meta"):
        model = build_llama("llama-1b")
    assert sum(p.numel() for p in model.parameters()) == 1_034_512_384
    cfg = model.config
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.hidden_act) == (32, 4, 5632, "silu")
    assert len(model.layers) == 22 and model.config._attn_implementation == "sdpa" and not model.config.use_cache
