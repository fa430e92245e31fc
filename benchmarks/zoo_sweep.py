"""Robustness sweep: kfuse on Hugging Face architectures outside the embedded zoo, built from their configs
with random weights. Each one is compiled, checked against eager on the same inputs and, on a GPU, timed
against PyTorch eager, eager in a CUDA graph and (``--baselines``) ``torch.compile``.

What it is for: a user's first question is whether kfuse takes *their* model. The embedded zoo covers
BERT, GPT-2, Llama, ViT, ResNet, an MLP, NeRF, MLP-Mixer and RepVGG; this sweep runs 22 more
architectures (encoders, decoders, CNNs, hierarchical and hybrid vision models) and records for each:
compiled or not, the error against eager, the ops left to PyTorch (``fallback``), compile seconds and
launches. Session 35's CPU run of it found two bugs: MobileBERT failed to import (a fallback op's
string argument read as a value name) and ConvNeXt's MLP chain wrote out of bounds (a 4-D GEMM output
taken for an NCHW image).

Each case runs in a worker process; a case that kills its worker (a CUDA fault poisons the context) is
recorded as crashed and the next worker goes on with the rest.

    PYTHONPATH=. python benchmarks/zoo_sweep.py --out $OUT                 # H200, fp16
    PYTHONPATH=. python benchmarks/zoo_sweep.py --out /tmp/z --smoke       # CPU: tiny configs, interpreter
    PYTHONPATH=. python benchmarks/zoo_sweep.py --only convnext,swin ...
    PYTHONPATH=. python benchmarks/zoo_sweep.py --out /tmp/e --smoke --set explore   # 31 more, CPU only (~25 min)
    PYTHONPATH=. python benchmarks/zoo_sweep.py --out /tmp/e --smoke --set explore2  # 27 more (audio too), CPU (~20 min)
    PYTHONPATH=. python benchmarks/zoo_sweep.py --out /tmp/t --set torchvision        # 15 torchvision models (GPU)
    PYTHONPATH=. python benchmarks/zoo_sweep.py --out /tmp/d --set diffusers          # SD 1.5's UNet and VAE decoder

Decoders run 4 of their layers (widths of the named checkpoint): the sweep is about coverage, and per
layer the work is the same.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported


@dataclass(frozen=True)
class Arch:
    """A Hugging Face architecture: its config and model classes (names in ``transformers``), the input kind,
    the config fields for the GPU run (``gpu``: a named checkpoint's widths) and for the CPU smoke run (``tiny``)."""

    config: str
    model: str
    kind: str  # "text" (input_ids), "image" (pixel_values), or audio: "wave", "mel", "spectrogram" (``audio_shape``)
    checkpoint: str  # whose widths ``gpu`` follows
    gpu: dict[str, Any] = field(default_factory=dict)
    tiny: dict[str, Any] = field(default_factory=dict)


TEXT_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=256,
                 max_position_embeddings=128, num_key_value_heads=2, d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16,
                 n_embd=64, n_layer=2, n_head=4, ffn_dim=128, embedding_size=64, head_dim=16)  # fmt: skip
IMAGE_TINY = dict(image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
DECODER_LAYERS = 4

ARCHS: dict[str, Arch] = {
    # encoders (B8 S128 on the GPU)
    "distilbert": Arch(
        "DistilBertConfig", "DistilBertModel", "text", "distilbert-base-uncased", {}, dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128)
    ),  # fmt: skip
    "roberta": Arch("RobertaConfig", "RobertaModel", "text", "roberta-base", {"vocab_size": 50265}),
    "albert": Arch(
        "AlbertConfig", "AlbertModel", "text", "albert-base-v2", dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)
    ),  # fmt: skip
    "deberta-v2": Arch(
        "DebertaV2Config",
        "DebertaV2Model",
        "text",
        "deberta-v3-base",
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    ),  # fmt: skip
    "mobilebert": Arch(
        "MobileBertConfig",
        "MobileBertModel",
        "text",
        "mobilebert-uncased",
        {},
        dict(embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32, num_feedforward_networks=2),
    ),  # fmt: skip
    "mpnet": Arch("MPNetConfig", "MPNetModel", "text", "mpnet-base"),
    "t5-encoder": Arch("T5Config", "T5EncoderModel", "text", "t5-base", dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12)),
    # decoders (B1 S512 prefill, 4 layers)
    "opt": Arch("OPTConfig", "OPTModel", "text", "opt-125m", {}, dict(word_embed_proj_dim=64)),
    "bloom": Arch("BloomConfig", "BloomModel", "text", "bloom-560m", dict(hidden_size=1024, n_head=16)),
    "gpt-neox": Arch(
        "GPTNeoXConfig", "GPTNeoXModel", "text", "pythia-160m", dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)
    ),  # fmt: skip
    "qwen2": Arch(
        "Qwen2Config",
        "Qwen2Model",
        "text",
        "Qwen2-0.5B",
        dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    ),  # fmt: skip
    "phi": Arch("PhiConfig", "PhiModel", "text", "phi-1_5", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32)),
    "gemma": Arch(
        "GemmaConfig",
        "GemmaModel",
        "text",
        "gemma-2b",
        dict(hidden_size=2048, intermediate_size=16384, num_attention_heads=8, num_key_value_heads=1, head_dim=256),
    ),  # fmt: skip
    # vision (B32 224 x 224 on the GPU)
    "convnext": Arch(
        "ConvNextConfig", "ConvNextModel", "image", "convnext-tiny-224", {}, dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])
    ),  # fmt: skip
    "swin": Arch(
        "SwinConfig",
        "SwinModel",
        "image",
        "swin-tiny-patch4-window7-224",
        {},
        dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4),
    ),  # fmt: skip
    "regnet": Arch(
        "RegNetConfig",
        "RegNetModel",
        "image",
        "regnet-y-040",
        {},
        dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], embedding_size=16, groups_width=8),
    ),  # fmt: skip
    "mobilenet-v2": Arch("MobileNetV2Config", "MobileNetV2Model", "image", "mobilenet_v2_1.0_224", {}, dict(depth_multiplier=0.35)),
    "efficientnet": Arch(
        "EfficientNetConfig",
        "EfficientNetModel",
        "image",
        "efficientnet-b0",
        dict(width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280),
        dict(width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=320),
    ),  # fmt: skip
    "deit": Arch(
        "DeiTConfig", "DeiTModel", "image", "deit-small-patch16-224", dict(hidden_size=384, num_attention_heads=6, intermediate_size=1536)
    ),  # fmt: skip
    "dinov2": Arch(
        "Dinov2Config", "Dinov2Model", "image", "dinov2-small", dict(hidden_size=384, num_attention_heads=6, image_size=224, patch_size=14)
    ),  # fmt: skip
    "segformer": Arch(
        "SegformerConfig",
        "SegformerModel",
        "image",
        "segformer-b0",
        {},
        dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4]),
    ),  # fmt: skip
    "clip-vision": Arch("CLIPVisionConfig", "CLIPVisionModel", "image", "clip-vit-base-patch32"),
}
# ``--set explore``: 31 more architectures that compile and match eager on the CPU (session 38's third exploratory
# sweep, which found the fallbacks conv1d, max/min.other, square, full_like, F.normalize's parts, adaptive_avg_pool1d,
# unflatten and Falcon's constant index, now native). CPU smoke coverage only: no checkpoint widths for the GPU.
EXPLORE: dict[str, Arch] = {
    name: Arch(cfg, model, kind, "-", {}, tiny or {})
    for name, cfg, model, kind, tiny in [
        ("electra", "ElectraConfig", "ElectraModel", "text", None),
        ("xlm-roberta", "XLMRobertaConfig", "XLMRobertaModel", "text", None),
        ("convbert", "ConvBertConfig", "ConvBertModel", "text", None),
        ("megatron-bert", "MegatronBertConfig", "MegatronBertModel", "text", None),
        ("rembert", "RemBertConfig", "RemBertModel", "text", dict(input_embedding_size=32, output_embedding_size=32)),
        ("ernie", "ErnieConfig", "ErnieModel", "text", None),
        ("mpt", "MptConfig", "MptModel", "text", dict(d_model=64, n_heads=4, n_layers=2)),
        ("falcon", "FalconConfig", "FalconModel", "text", None),
        ("mistral", "MistralConfig", "MistralModel", "text", None),
        ("phi3", "Phi3Config", "Phi3Model", "text", dict(pad_token_id=0)),
        ("gemma2", "Gemma2Config", "Gemma2Model", "text", None),
        ("qwen3", "Qwen3Config", "Qwen3Model", "text", None),
        ("granite", "GraniteConfig", "GraniteModel", "text", None),
        ("olmo2", "Olmo2Config", "Olmo2Model", "text", None),
        ("persimmon", "PersimmonConfig", "PersimmonModel", "text", None),
        ("xglm", "XGLMConfig", "XGLMModel", "text", dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=128)),
        ("biogpt", "BioGptConfig", "BioGptModel", "text", None),
        ("gpt-neo", "GPTNeoConfig", "GPTNeoModel", "text", dict(attention_types=[[["global", "local"], 1]], window_size=8)),
        ("nemotron", "NemotronConfig", "NemotronModel", "text", None),
        ("beit", "BeitConfig", "BeitModel", "image", None),
        ("mobilevit", "MobileViTConfig", "MobileViTModel", "image",
         dict(image_size=64, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32])),
        ("mobilevitv2", "MobileViTV2Config", "MobileViTV2Model", "image", dict(image_size=128, width_multiplier=0.25, patch_size=2)),
        ("resnet", "ResNetConfig", "ResNetModel", "image", dict(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1])),
        ("focalnet", "FocalNetConfig", "FocalNetModel", "image",
         dict(embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3])),
        ("swinv2", "Swinv2Config", "Swinv2Model", "image", dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)),
        ("vit", "ViTConfig", "ViTModel", "image", None),
        ("siglip-vision", "SiglipVisionConfig", "SiglipVisionModel", "image", None),
        ("pvt-v2", "PvtV2Config", "PvtV2Model", "image",
         dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4])),
        ("vitdet", "VitDetConfig", "VitDetModel", "image", None),
        ("dpt", "DPTConfig", "DPTModel", "image", None),
        ("glpn", "GLPNConfig", "GLPNModel", "image",
         dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4], decoder_hidden_size=16)),
    ]
}  # fmt: skip
# explore architectures with a named checkpoint's widths (their config class's defaults), so a GPU run can time
# what the CPU sweep made fusable: XGLM's (B*H, S, D) attention, Falcon's multi-query, MPT's and GPT-Neo's
# causal masks, MobileViT-V2's group norm and patch fold (session 39), Swin-V2's window mask and ViTDet's stacked
# Q, K, V (session 40). The rest stay smoke-only.
GPU_WIDTHS = {"xglm": "xglm-564M", "falcon": "falcon-7b", "mpt": "mpt-1b-redpajama-200b", "gpt-neo": "gpt-neo-1.3B",
              "mobilevitv2": "mobilevitv2-1.0-imagenet1k-256",
              # config defaults: Swin-V2-T at 224 px with 7 x 7 windows (half its layers shifted), ViTDet-B (global attention)
              "swinv2": "swinv2-tiny (Swinv2Config defaults)", "vitdet": "vitdet-base (VitDetConfig defaults)"}  # fmt: skip
EXPLORE.update({n: Arch(a.config, a.model, a.kind, GPU_WIDTHS[n], {}, a.tiny) for n, a in EXPLORE.items() if n in GPU_WIDTHS})
# ``--set explore2``: session 42's fourth exploratory sweep, 27 more (audio among them), each compiled and
# matched against eager on the CPU. It found the fallbacks stack (GPT-J's interleaved rotary, now a rotary
# kernel), repeat, tile, meshgrid, reshape_as, max over a dim and grouped convs (now the conv template), and
# left unfused: CodeGen's mask-then-scale attention, the query scale of OPT / Whisper, a conv1d's GELU.
_WAVE = dict(conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
EXPLORE2: dict[str, Arch] = {
    name: Arch(cfg, model, kind, "-", {}, tiny or {})
    for name, cfg, model, kind, tiny in [
        ("modernbert", "ModernBertConfig", "ModernBertModel", "text",
         dict(global_attn_every_n_layers=2, local_attention=8, pad_token_id=0, bos_token_id=1, eos_token_id=2, sep_token_id=2,
              cls_token_id=1)),
        ("squeezebert", "SqueezeBertConfig", "SqueezeBertModel", "text", None),
        ("roformer", "RoFormerConfig", "RoFormerModel", "text", None),
        ("esm", "EsmConfig", "EsmModel", "text", dict(position_embedding_type="rotary", pad_token_id=1, mask_token_id=2)),
        ("gptj", "GPTJConfig", "GPTJModel", "text", dict(rotary_dim=8)),
        ("codegen", "CodeGenConfig", "CodeGenModel", "text", dict(rotary_dim=8)),
        ("cohere", "CohereConfig", "CohereModel", "text", None),
        ("stablelm", "StableLmConfig", "StableLmModel", "text", None),
        ("starcoder2", "Starcoder2Config", "Starcoder2Model", "text", None),
        ("gpt-bigcode", "GPTBigCodeConfig", "GPTBigCodeModel", "text", None),
        ("gemma3", "Gemma3TextConfig", "Gemma3TextModel", "text", dict(sliding_window=8)),
        ("glm4", "Glm4Config", "Glm4Model", "text", dict(pad_token_id=0)),
        ("bitnet", "BitNetConfig", "BitNetModel", "text", None),
        ("convnextv2", "ConvNextV2Config", "ConvNextV2Model", "image", dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1])),
        ("poolformer", "PoolFormerConfig", "PoolFormerModel", "image", dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1])),
        ("yolos", "YolosConfig", "YolosModel", "image", dict(image_size=[64, 96], num_detection_tokens=4)),
        ("hiera", "HieraConfig", "HieraModel", "image",
         dict(image_size=[64, 64], patch_size=[7, 7], embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 2, 4])),
        ("mobilenet-v1", "MobileNetV1Config", "MobileNetV1Model", "image", dict(depth_multiplier=0.25)),
        ("swiftformer", "SwiftFormerConfig", "SwiftFormerModel", "image", dict(embed_dims=[16, 24, 32, 48], depths=[1, 1, 1, 1])),
        ("dinov3-vit", "DINOv3ViTConfig", "DINOv3ViTModel", "image", dict(num_register_tokens=2)),
        ("pvt", "PvtConfig", "PvtModel", "image",
         dict(hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_attention_heads=[1, 2, 2, 4])),
        ("wav2vec2", "Wav2Vec2Config", "Wav2Vec2Model", "wave", _WAVE),
        ("hubert", "HubertConfig", "HubertModel", "wave", _WAVE),
        ("wavlm", "WavLMConfig", "WavLMModel", "wave", _WAVE),
        ("whisper-encoder", "WhisperConfig", "WhisperModel.encoder", "mel",
         dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, decoder_attention_heads=4, decoder_layers=1,
              decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16)),
        ("ast", "ASTConfig", "ASTModel", "spectrogram",
         dict(max_length=32, num_mel_bins=32, patch_size=8, frequency_stride=8, time_stride=8)),
        ("regnet-x", "RegNetConfig", "RegNetModel", "image",
         dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], embedding_size=16, groups_width=8, layer_type="x")),
    ]
}  # fmt: skip
# GPU widths (the config class's defaults: GPT-J-6B / CodeGen-6B widths at 4 layers, whisper-tiny's encoder, wav2vec2-base,
# squeezebert-uncased), so a GPU run times the session's interleaved rotary, grouped conv1d and the audio front ends
GPU_WIDTHS2 = {"gptj": "gpt-j-6b (GPTJConfig defaults)", "codegen": "codegen-6B (CodeGenConfig defaults)",
               "whisper-encoder": "whisper-tiny (WhisperConfig defaults)", "wav2vec2": "wav2vec2-base (Wav2Vec2Config defaults)",
               "squeezebert": "squeezebert-uncased (SqueezeBertConfig defaults)"}  # fmt: skip
EXPLORE2.update({n: Arch(a.config, a.model, a.kind, GPU_WIDTHS2[n], {}, a.tiny) for n, a in EXPLORE2.items() if n in GPU_WIDTHS2})
GPU_WIDTHS = {**GPU_WIDTHS, **GPU_WIDTHS2}

# ``--set torchvision``: session 43's models from torchvision (``config="torchvision"``, ``model`` the builder's name
# in ``torchvision.models``, ``segmentation.`` for the heads; widths are the architecture's own, ``gpu`` and ``tiny``
# give the image size). A CPU probe of all 80 classification and 6 segmentation builders found the fallbacks closed
# that session: ``nn.MultiheadAttention``'s head split copies (ViT; now views, and its attention fused like Hugging
# Face's), ``new_zeros`` / slice writes (Swin's shifted-window mask, now constant), Swin-V2's bias gather (folded),
# MaxViT's einsum over five dims (now a batched matmul, then fused attention), and the segmentation heads' bilinear
# upsampling (now a kernel). On the GPU machine torchvision imports; on a CPU with PyPI's CUDA wheel of torchvision
# beside a CPU torch it does not (``torchvision::nms``), and the sweep says so.
TORCHVISION: dict[str, Arch] = {
    f"tv-{n.split('.')[-1].replace('_', '-')}": Arch("torchvision", n, "image", n, {"size": size}, {"size": tiny})
    for n, size, tiny in [
        ("vit_b_16", 224, 64), ("swin_t", 224, 64), ("swin_v2_t", 256, 64), ("maxvit_t", 224, 224), ("convnext_tiny", 224, 64),
        ("efficientnet_v2_s", 384, 64), ("regnet_y_1_6gf", 224, 64), ("resnext50_32x4d", 224, 64), ("mobilenet_v3_large", 224, 64),
        ("densenet121", 224, 64), ("inception_v3", 299, 96), ("shufflenet_v2_x1_0", 224, 64),
        ("segmentation.fcn_resnet50", 520, 64), ("segmentation.deeplabv3_resnet50", 520, 64),
        ("segmentation.lraspp_mobilenet_v3_large", 520, 64),
    ]
}  # fmt: skip
# ``--set diffusers``: Stable Diffusion 1.5's denoising UNet (one step: latents [2, 4, 64, 64], the prompt's and the
# empty prompt's text states [2, 77, 768], as classifier-free guidance runs it) and its VAE decoder (latents
# [1, 4, 64, 64] -> a 512 x 512 image), the checkpoint's widths with random weights (``config="diffusers"``,
# ``model`` the class in ``diffusers``, ``.decoder`` for a part). GroupNorm + SiLU, cross-attention and nearest
# upsampling are the ops these add over the other sets. Needs ``diffusers`` (a dev dependency; on the GPU machine
# carried as wheels).
SD15_UNET = dict(cross_attention_dim=768)  # UNet2DConditionModel's defaults are SD 1.5's but this
SD15_VAE = dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, sample_size=512)  # fmt: skip
DIFFUSERS: dict[str, Arch] = {
    "sd15-unet": Arch("diffusers", "UNet2DConditionModel", "latent-text", "stable-diffusion-v1-5 unet", SD15_UNET,
                      dict(block_out_channels=(16, 32), layers_per_block=1, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                           up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, attention_head_dim=8,
                           norm_num_groups=4, sample_size=8)),
    "sd15-vae-decoder": Arch("diffusers", "AutoencoderKL.decoder", "latent", "stable-diffusion-v1-5 vae", SD15_VAE,
                             dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                                  block_out_channels=(16, 32), layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=8)),
}  # fmt: skip
SETS = {"zoo": ARCHS, "explore": EXPLORE, "explore2": EXPLORE2, "torchvision": TORCHVISION, "diffusers": DIFFUSERS}
ALL_ARCHS = {**ARCHS, **EXPLORE, **EXPLORE2, **TORCHVISION, **DIFFUSERS}
ENCODERS = ("distilbert", "roberta", "albert", "deberta-v2", "mobilebert", "mpnet", "t5-encoder", "squeezebert")
BATCH = {"text": 8, "image": 32, "audio": 8}
AUDIO_SAMPLES = 16000 * 10  # ten seconds at 16 kHz
DECODER_BATCH, DECODER_SEQ, ENCODER_SEQ = 1, 512, 128
TOLERANCE = 2e-2  # kfuse's own check (fp16)


def build(name: str, smoke: bool, device: str, dtype: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The model (random weights, seeded) and its inputs."""
    import torch
    import transformers  # noqa: F401 - before the torchvision branch too: the sweep needs it either way

    a = ALL_ARCHS[name]
    if a.config == "torchvision":
        return build_torchvision(a, smoke, device, dtype)
    if a.config == "diffusers":
        return build_diffusers(a, smoke, device, dtype)
    cfg = getattr(transformers, a.config)()
    over = {**(TEXT_TINY if a.kind == "text" else IMAGE_TINY), **a.tiny} if smoke else dict(a.gpu)
    if not smoke and a.kind == "text" and name not in ENCODERS:
        over = {**over, **{k: DECODER_LAYERS for k in ("num_hidden_layers", "n_layer", "num_layers")}}
    for k, v in over.items():
        if hasattr(cfg, k):
            try:
                setattr(cfg, k, v)
            except (AttributeError, NotImplementedError):  # a derived property (Falcon's head_dim, Funnel's layer count)
                pass
    torch.manual_seed(0)
    with torch.device(device):
        cls, _, part = a.model.partition(".")  # "WhisperModel.encoder": that part of the model
        model = getattr(transformers, cls)(cfg)
        model = getattr(model, part) if part else model
        if a.kind != "text":
            fan_in_init(model)
        model = model.eval()
    gen = torch.Generator().manual_seed(1)
    if a.kind == "text":
        vocab = int(getattr(cfg, "vocab_size", 256))
        b, s = (2, 16) if smoke else ((BATCH["text"], ENCODER_SEQ) if name in ENCODERS else (DECODER_BATCH, DECODER_SEQ))
        x = torch.randint(3, min(vocab, 30000), (b, s), generator=gen).to(device)
    elif a.kind == "image":
        size = getattr(cfg, "image_size", 224) if smoke else 224
        h, w = (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))  # YOLOS, Hiera: [H, W]
        b = 2 if smoke else BATCH["image"]
        x = torch.randn(b, int(getattr(cfg, "num_channels", 3)), h, w, generator=gen).to(device=device, dtype=dtype)
    else:
        x = torch.randn(audio_shape(a.kind, cfg, smoke), generator=gen).to(device=device, dtype=dtype)
    if a.kind != "text":
        calibrate_batch_norms(model, x.float())
    return model.to(dtype), (x,), {}


def build_torchvision(a: Arch, smoke: bool, device: str, dtype: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A torchvision model (random weights, fan-in initialised, 10 classes; no auxiliary heads) and its image."""
    import torch

    try:
        import torchvision
    except RuntimeError as e:  # PyPI's CUDA torchvision beside a CPU torch: its C ops are missing
        raise RuntimeError(f"torchvision does not import here ({e}); install the torchvision built for this torch") from e
    size = (a.tiny if smoke else a.gpu)["size"]
    kind, _, fn = a.model.rpartition(".")
    builder = getattr(getattr(torchvision.models, kind) if kind else torchvision.models, fn)
    from kfuse.models.torchvision_models import builder_kwargs

    kw: dict[str, Any] = {**builder_kwargs(fn, kind == "segmentation", size), "num_classes": 10}
    torch.manual_seed(0)
    with torch.device(device):
        model = builder(**kw)
        fan_in_init(model)
        model = model.eval()
    gen = torch.Generator().manual_seed(1)
    b = 2 if smoke else BATCH["image"]
    x = torch.randn(b, 3, size, size, generator=gen).to(device=device)
    calibrate_batch_norms(model, x)
    return model.to(dtype), (x.to(dtype),), {}


def build_diffusers(a: Arch, smoke: bool, device: str, dtype: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A diffusers model with PyTorch's default initialisation (its GroupNorms keep activations in range) and its
    inputs: the UNet's noisy latents, a timestep per image and the text states; the VAE decoder's latents."""
    import diffusers
    import torch

    cls, _, part = a.model.partition(".")
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(diffusers, cls)(**(a.tiny if smoke else a.gpu))
        model = (getattr(model, part) if part else model).eval()
    gen = torch.Generator().manual_seed(1)
    size = (a.tiny if smoke else a.gpu).get("sample_size", 64)
    if a.kind == "latent-text":  # the UNet: latents at the model's sample size, the text states [B, 77, cross_attention_dim]
        b, tokens, width = (2, 7, a.tiny["cross_attention_dim"]) if smoke else (2, 77, a.gpu["cross_attention_dim"])
        latents = torch.randn(b, 4, size, size, generator=gen)
        text = torch.randn(b, tokens, width, generator=gen)
        t = torch.full((b,), 981, dtype=torch.long)
        return model.to(dtype), (latents.to(device, dtype), t.to(device), text.to(device, dtype)), {}
    down = 2 ** (len((a.tiny if smoke else a.gpu)["block_out_channels"]) - 1)  # the decoder's latents: the image size / 2^(blocks-1)
    z = torch.randn(1 if not smoke else 2, 4, size // down, size // down, generator=gen)
    return model.to(dtype), (z.to(device, dtype),), {}


def audio_shape(kind: str, cfg: Any, smoke: bool) -> tuple[int, ...]:
    """An audio model's input: a waveform (``wave``: wav2vec2's family, 16 kHz samples), a log-mel spectrogram
    (``mel``: Whisper's encoder, [B, mels, 2 x source positions]) or its transpose (``spectrogram``: AST)."""
    b = 2 if smoke else BATCH["audio"]
    if kind == "wave":
        return (b, 8000 if smoke else AUDIO_SAMPLES)
    if kind == "mel":
        return (b, int(cfg.num_mel_bins), 2 * int(cfg.max_source_positions))
    if kind == "spectrogram":
        return (b, int(cfg.max_length), int(cfg.num_mel_bins))
    raise ValueError(f"unknown input kind {kind!r}")


def fan_in_init(model: Any) -> None:
    """Weights that keep a deep CNN's activations alive: Hugging Face's initialisation (std 0.02, unit batch
    norms) left EfficientNet-B0's and MobileNet-V2's outputs at 0 and 1e-21, so any kernel would have
    passed the check. Convolutions and linears at std sqrt(2 / fan_in), batch norms with random statistics."""
    import torch

    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d | torch.nn.Linear):
            torch.nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
            if mod.bias is not None:
                torch.nn.init.normal_(mod.bias, std=0.05)
        elif isinstance(mod, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(mod.weight, 0.5, 1.5)
            torch.nn.init.normal_(mod.bias, std=0.1)
            mod.running_mean.normal_(std=0.1)
            mod.running_var.uniform_(0.5, 1.5)


def calibrate_batch_norms(model: Any, x: Any) -> None:
    """Batch-norm running statistics measured on the example input (one fp32 pass, the norms alone in training
    mode, cumulative averages), so each norm outputs about unit variance before its random affine. With random
    statistics, fan-in weights let torchvision's RegNet-Y-1.6GF grow past fp16's range (session 44: eager's own
    fp16 output was NaN, so nothing was checked) and left the Hugging Face RegNet-Y's and MobileNet-V2's eager
    fp16 outputs 50% off fp32, a check too loose to catch a wrong kernel. Timing does not depend on it."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms or x.device.type == "meta":  # a meta tensor has no values to measure (tests/frontend/test_model_on_another_device.py)
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative: one pass sets the statistics to this batch's
        m.train()
    try:
        with torch.no_grad():
            model(x.to(next(model.parameters()).dtype))
    finally:
        for m in norms:
            m.eval()


def first_tensor(out: Any) -> Any:
    """The model's main output (``last_hidden_state``, else the first tensor)."""
    import torch
    from torch.utils import _pytree as pytree

    if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None:
        return out.last_hidden_state
    return next(t for t in pytree.tree_leaves(out.to_tuple() if hasattr(out, "to_tuple") else out) if isinstance(t, torch.Tensor))


def fp32_reference(model: Any, a: tuple[Any, ...], kw: dict[str, Any], eager16: Any, kfuse16: Any) -> dict[str, float]:
    """Both fp16 results against the model in fp32 (TF32 off): some random-weight CNNs amplify rounding so much
    that eager's own fp16 output is 18% off (session 35: MobileNet-V2 and RegNet-Y with fan-in weights, where
    kfuse's was as far or closer), so kfuse is judged wrong only where it is much farther off than eager."""
    import copy

    import torch

    from kfuse.bench.harness import max_rel_err

    m32 = copy.deepcopy(model).float()
    a32 = tuple(x.float() if x.is_floating_point() else x for x in a)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        ref32 = first_tensor(m32(*a32, **kw)).float()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    del m32
    return {"err_vs_fp32": max_rel_err(kfuse16.float(), ref32), "eager_err_vs_fp32": max_rel_err(eager16.float(), ref32)}


def run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import kfuse
    from kfuse.bench.harness import max_rel_err, pytorch_baselines, time_ms

    gpu = torch.cuda.is_available() and not args.smoke
    device, dtype = ("cuda", torch.float16) if gpu else ("cpu", torch.float32)
    model, a, kw = build(name, args.smoke, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    rec: dict[str, Any] = {"arch": name, "checkpoint_widths": ALL_ARCHS[name].checkpoint, "params_m": round(params / 1e6, 2),
                           "input": list(a[0].shape), "device": device}  # fmt: skip
    with torch.no_grad():
        ref = first_tensor(model(*a, **kw))
        t0 = time.perf_counter()
        try:
            compiled = kfuse.compile(model, a, kw, tune=args.tune if gpu else "none")
        except Exception as e:  # a model kfuse cannot compile: recorded, the sweep goes on
            rec.update(failure(e), compiled=False)
            return rec
        rec["kfuse_compile_s"] = round(time.perf_counter() - t0, 2)
        rep = compiled.report
        rec["compile_phases_s"] = rep.get("compile_phases_s")  # where a long compile went (EfficientNet: 161 s, session 39)
        rec["pdl_choice"] = rep.get("pdl_choice")  # the plan timed with PDL on and off (Options.pdl="auto")
        out = first_tensor(compiled(*a, **kw))
        err = max_rel_err(out, ref)
        rec["ref_abs_max"] = float(ref.abs().max())
        if not rec["ref_abs_max"] > 0:  # a zero reference checks nothing
            err = float("inf")
        ok = err <= TOLERANCE
        if dtype != torch.float32:  # judged against fp32, as eager's own fp16 result is
            rec.update(fp32_reference(model, a, kw, ref, out))
            ok = rec["err_vs_fp32"] <= max(TOLERANCE, 2.0 * rec["eager_err_vs_fp32"])
            if not math.isfinite(rec["eager_err_vs_fp32"]):  # eager's own fp16 result overflowed: nothing was checked
                ok, rec["unchecked"] = False, "eager's fp16 output is not finite against fp32"

        rec.update(compiled=True, max_rel_err=err, ok=ok, fallback=rep.get("fallback", []),
                   launches=len(rep.get("kernels", [])), cuda_graph=rep.get("cuda_graph"),
                   b2b_fused=len((rep.get("b2b") or {}).get("fused", [])), templates=templates(rep))  # fmt: skip
        if gpu:
            which = args.baselines.split(",")
            lines: list[str] = []
            times, _, base_s = pytorch_baselines(model, a, kw, which=which, warmup=args.warmup, rep=args.rep, log=lines.append)
            rec["baselines_ms"] = times
            rec["baseline_errors"] = [ln.strip() for ln in lines if "failed" in ln]  # a side that could not run, and why
            rec["baseline_compile_s"] = {k: round(v, 1) for k, v in base_s.items()}
            rec["kfuse_ms"] = time_ms(lambda: compiled(*a, **kw), args.warmup, args.rep)  # make_record adds the speedup
    return rec


def failure(e: BaseException) -> dict[str, Any]:
    """A case's failure: its error, and where it faulted the GPU (the context is lost: every later case of
    this worker would fail with it), ``crashed``; ``tb`` the traceback's end (session 39's T5 failure, a
    device mismatch, named no frame without it)."""
    from kfuse.runtime import cuda_fault

    rec: dict[str, Any] = {"error": f"{type(e).__name__}: {str(e)[:300]}", "tb": traceback.format_exc()[-3000:]}
    if isinstance(e, cuda_fault.CudaFault) or cuda_fault.is_fault(e):
        rec.update(crashed=True)
    return rec


def templates(report: dict[str, Any]) -> dict[str, int]:
    """Steps per template (``torch`` marks a step run by PyTorch inside the plan, ``view`` a cat served as a view of
    its inputs' shared buffer: no launch)."""
    out: dict[str, int] = {}
    for k in report.get("kernels", []):
        out[k["template"]] = out.get(k["template"], 0) + 1
    return out


def worker(args: argparse.Namespace, names: list[str]) -> None:
    """Run ``names`` in order, one JSON line per finished case in ``args.jsonl``."""
    for name in names:
        with open(args.jsonl, "a") as f:  # the case about to run: a crash leaves this line as its record
            f.write(json.dumps({"arch": name, "started": True}) + "\n")
        if os.environ.get("ZOO_SWEEP_CRASH") == name:  # tests: a worker that dies mid-case, as a CUDA fault makes it
            os._exit(1)
        try:
            rec = run_case(name, args)
        except Exception as e:  # noqa: BLE001 - anything a model does wrong is its record, not the sweep's end
            rec = {"arch": name, "compiled": False, **failure(e)}
        with open(args.jsonl, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        print(f"  {name:14s} {summary_line(rec)}", flush=True)
        if rec.get("tb"):
            print(rec["tb"][-1500:], flush=True)
        if rec.get("crashed"):
            os._exit(1)  # the driver starts a fresh worker for the rest


def summary_line(r: dict[str, Any]) -> str:
    if r.get("crashed"):
        return "CRASHED (worker died)"
    if not r.get("compiled"):
        return f"FAILED {r.get('error', '')[:150]}"
    t = f"  kfuse {r['kfuse_ms']:.3f} ms vs best {min(r['baselines_ms'].values()):.3f}" if r.get("baselines_ms") else ""
    fb = ",".join(r["fallback"]) or "-"
    return f"{'ok ' if r['ok'] else 'ERR'} err {r['max_rel_err']:.1e}  compile {r['kfuse_compile_s']:.1f} s  fallback {fb}{t}"


def collect(path: Path) -> dict[str, dict[str, Any]]:
    """Each case's last line; a case whose last line is its start marker crashed its worker."""
    last: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            last[r["arch"]] = r
    return {k: ({"arch": k, "compiled": False, "crashed": True} if r.get("started") else r) for k, r in last.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/h200")
    p.add_argument(
        "--set",
        default="zoo",
        choices=sorted(SETS),
        help="zoo: the 22 benchmarked architectures; explore, explore2: 31 and 27 more (--smoke; GPU widths for a few); "
        "torchvision: 15 torchvision models (12 classifiers, 3 segmentation heads); diffusers: Stable Diffusion 1.5's UNet and "
        "VAE decoder",
    )
    p.add_argument("--only", default="", help="comma list (default: the whole set) of: " + ",".join(ALL_ARCHS))
    p.add_argument("--baselines", default="eager,eager_cudagraph,compile")
    p.add_argument("--tune", default="fast", choices=("none", "fast", "full"))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rep", type=int, default=20)
    p.add_argument("--case-timeout", type=int, default=240, help="seconds a worker may spend on one case")
    p.add_argument("--smoke", action="store_true", help="tiny configs on the CPU (interpreter), no timing")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--jsonl", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SETS[args.set])
    unknown = [n for n in names if n not in ALL_ARCHS]
    if unknown:
        p.error(f"unknown architecture(s) {', '.join(unknown)}; known: {', '.join(ALL_ARCHS)}")
    no_widths = [n for n in names if ALL_ARCHS[n].checkpoint == "-"]
    if not args.smoke and no_widths:
        p.error(f"no GPU widths for {', '.join(no_widths)} (explore set; GPU widths: {', '.join(GPU_WIDTHS)}): run it with --smoke")
    if args.worker:
        worker(args, args.worker.split(","))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "zoo_sweep.jsonl"
    jsonl.unlink(missing_ok=True)
    passthrough = ["--out", str(out), "--baselines", args.baselines, "--tune", args.tune, "--warmup", str(args.warmup),
                   "--rep", str(args.rep)] + (["--smoke"] if args.smoke else [])  # fmt: skip
    t0 = time.time()
    while True:
        done = collect(jsonl)
        left = [n for n in names if n not in done]
        if not left:
            break
        cmd = [sys.executable, __file__, *passthrough, "--worker", ",".join(left), "--jsonl", str(jsonl)]
        try:
            subprocess.run(cmd, timeout=args.case_timeout * len(left), check=False)
        except subprocess.TimeoutExpired:
            pass
        after = collect(jsonl)
        if len(after) == len(done):  # the worker died before starting a case: do not loop forever
            for n in left:
                after.setdefault(n, {"arch": n, "compiled": False, "crashed": True})
            with open(jsonl, "a") as f:
                f.writelines(json.dumps(after[n]) + "\n" for n in left)
    records = write_records(collect(jsonl), names, args, out)
    print(f"\n{len(records)} architectures in {time.time() - t0:.0f} s -> {out / 'zoo_sweep.json'}")
    print(f"{'arch':14s} {'result':4s} {'err':>8s} {'compile_s':>9s} {'kfuse ms':>9s} {'best ms':>9s} {'speedup':>7s}  fallback")
    for r in records:
        failed = "UNCHK" if r.get("unchecked") else "ERR" if r.get("compiled") else "FAIL"
        ok = "ok" if r.get("ok") else ("CRASH" if r.get("crashed") else failed)
        best = min(r["baselines_ms"].values()) if r.get("baselines_ms") else None
        cols = [f"{r['max_rel_err']:.1e}" if r.get("compiled") else "-", f"{r.get('kfuse_compile_s', 0):.1f}",
                f"{r['kfuse_ms']:.3f}" if r.get("kfuse_ms") else "-", f"{best:.3f}" if best else "-",
                f"{best / r['kfuse_ms']:.2f}x" if best and r.get("kfuse_ms") else "-"]  # fmt: skip
        fb = ",".join(r.get("fallback", [])) or "-"
        print(f"{r['arch']:14s} {ok:4s} {cols[0]:>8s} {cols[1]:>9s} {cols[2]:>9s} {cols[3]:>9s} {cols[4]:>7s}  {fb}")


def write_records(done: dict[str, dict[str, Any]], names: list[str], args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    from kfuse.bench.harness import make_record, write_results

    argv, skip = [], False
    for a in sys.argv[1:]:  # the command without the machine's output folder (--out DIR or --out=DIR)
        if not skip and not a.startswith("--out"):
            argv.append(a)
        skip = a == "--out"
    command = "PYTHONPATH=. python benchmarks/zoo_sweep.py " + " ".join(argv)
    records = []
    for n in names:
        r = dict(done[n])
        rec = make_record("zoo_sweep", n, r.pop("kfuse_ms", None), r.pop("baselines_ms", {}), None, r.pop("max_rel_err", None), command,
                          dtype="fp32" if args.smoke else "fp16", **r)  # fmt: skip
        rec["smoke"] = bool(args.smoke)
        records.append(rec)
    write_results("zoo_sweep", records, out)
    return records


if __name__ == "__main__":
    main()
