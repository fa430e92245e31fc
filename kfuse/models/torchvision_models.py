"""A torchvision model by name (``torchvision:densenet121``), with a random image batch of its own size, for
``kfuse compile torchvision:NAME`` / ``kfuse bench``.

Nothing is downloaded: the weights are random (seeded), which is what compiling and timing need; a model with
trained weights goes through the Python API (``kfuse.compile(model, (x,))``). The image size is the one its
pretrained weights were evaluated at (the weights' ``crop_size``, else ``resize_size``: DenseNet 224,
Inception-v3 299, EfficientNet-V2-S 384, the segmentation heads 520), unless given. Classifiers and the
segmentation models are supported; detection, video and optical-flow models take other inputs.
"""

from __future__ import annotations

from typing import Any

import torch

PREFIXES = ("torchvision:", "tv:")


class TorchvisionLoadError(ValueError):
    """The name is not a torchvision model kfuse can build, or torchvision is not usable here; says why."""


def is_torchvision_name(model: str) -> bool:
    return model.startswith(PREFIXES)


def _torchvision() -> Any:
    try:
        import torchvision
    except ImportError as e:
        raise TorchvisionLoadError("torchvision is not installed (pip install torchvision)") from e
    except RuntimeError as e:  # a torchvision wheel built for another torch: its C ops are missing
        raise TorchvisionLoadError(f"torchvision does not import with this torch ({e}); install the torchvision built for it") from e
    return torchvision


def image_size(tv: Any, name: str) -> int:
    """The side of the square image the model's pretrained weights were evaluated at (224 where none say)."""
    try:
        t = tv.models.get_model_weights(name).DEFAULT.transforms()
    except (ValueError, KeyError, AttributeError):
        return 224
    size = getattr(t, "crop_size", None) or getattr(t, "resize_size", None)
    return int(size[0]) if size else 224


def builder_kwargs(name: str, segmentation: bool, size: int | None = None) -> dict[str, Any]:
    """The builder's arguments for an inference model with random weights: no auxiliary heads, no weight download,
    and a ViT's position table for ``size`` where one is asked."""
    kw: dict[str, Any] = {"weights": None}
    if segmentation:
        kw.update(weights_backbone=None, aux_loss=False)
    if name in ("inception_v3", "googlenet"):
        kw.update(aux_logits=False, init_weights=False)
    if name.startswith("vit_") and size:
        kw["image_size"] = size
    return kw


def load_torchvision(
    model: str,
    *,
    batch: int | None = None,
    size: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]:
    """(eval model on ``device`` in ``dtype``, (image batch,), {}) for ``torchvision:NAME``; ``batch`` default 1."""
    name = model.split(":", 1)[1]
    tv = _torchvision()
    classifiers = set(tv.models.list_models(module=tv.models))
    segmentation = set(tv.models.list_models(module=tv.models.segmentation))
    if name not in classifiers | segmentation:
        known = sorted(set(tv.models.list_models()))
        hint = "" if name not in known else " (a detection, video or optical-flow model: they take other inputs)"
        raise TorchvisionLoadError(f"{name!r} is not a torchvision classifier or segmentation model{hint}; "
                                   f"classifiers: {', '.join(sorted(classifiers)[:8])}, ...")  # fmt: skip
    side = size or image_size(tv, name)
    torch.manual_seed(seed)
    m = tv.models.get_model(name, **builder_kwargs(name, name in segmentation, size)).eval().to(device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch or 1, 3, side, side, generator=gen).to(device=device, dtype=dtype)
    return m, (x,), {}
