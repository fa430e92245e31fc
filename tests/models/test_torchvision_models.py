"""``kfuse compile torchvision:NAME``: the loader builds the model with random weights and an image of its own size,
and says clearly when torchvision is missing or the name is not a model it can take. torchvision is not a
dependency, so a stand-in module plays it here (the GPU machine has the real one)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from kfuse.cli import app
from kfuse.models.torchvision_models import TorchvisionLoadError, is_torchvision_name, load_torchvision


class _Net(nn.Module):
    def __init__(self, **kw: Any) -> None:
        super().__init__()
        self.kw = kw
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean((2, 3))


def _fake_torchvision() -> types.ModuleType:
    tv = types.ModuleType("torchvision")
    models = types.ModuleType("torchvision.models")
    models.segmentation = types.ModuleType("torchvision.models.segmentation")
    lists = {models: ["densenet121", "inception_v3"], models.segmentation: ["fcn_resnet50"], None: ["densenet121", "inception_v3",
             "fcn_resnet50", "fasterrcnn_resnet50_fpn"]}  # fmt: skip
    models.list_models = lambda module=None: lists[module]
    models.get_model = lambda name, **kw: _Net(name=name, **kw)
    sizes = {"densenet121": ([224], [256]), "inception_v3": ([299], [342]), "fcn_resnet50": (None, [520])}

    def weights(name: str) -> Any:
        crop, resize = sizes[name]
        transforms = types.SimpleNamespace(crop_size=crop, resize_size=resize)
        return types.SimpleNamespace(DEFAULT=types.SimpleNamespace(transforms=lambda: transforms))

    models.get_model_weights = weights
    tv.models = models
    return tv


@pytest.fixture
def fake_tv(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    tv = _fake_torchvision()
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    return tv


def test_names() -> None:
    assert is_torchvision_name("torchvision:resnet50") and is_torchvision_name("tv:resnet50")
    assert not is_torchvision_name("resnet50") and not is_torchvision_name("bert-base")


def test_the_image_size_is_the_weights_own(fake_tv: types.ModuleType) -> None:
    m, (x,), kw = load_torchvision("torchvision:inception_v3", batch=2)
    assert x.shape == (2, 3, 299, 299) and kw == {}
    assert m.kw == {"name": "inception_v3", "weights": None, "aux_logits": False, "init_weights": False} and not m.training
    _, (x,), _ = load_torchvision("tv:densenet121")
    assert x.shape == (1, 3, 224, 224)
    m, (x,), _ = load_torchvision("tv:fcn_resnet50", size=64, dtype=torch.float64)  # no crop size: the resize size
    assert x.shape == (1, 3, 64, 64) and x.dtype == torch.float64 and m.kw["weights_backbone"] is None
    _, (x,), _ = load_torchvision("tv:fcn_resnet50")
    assert x.shape[-1] == 520


def test_unknown_and_unsupported_models_say_why(fake_tv: types.ModuleType) -> None:
    with pytest.raises(TorchvisionLoadError, match="not a torchvision classifier or segmentation model; classifiers: densenet121"):
        load_torchvision("tv:densenet12")
    with pytest.raises(TorchvisionLoadError, match="detection, video or optical-flow"):
        load_torchvision("tv:fasterrcnn_resnet50_fpn")


def test_without_torchvision_the_cli_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision raises ImportError
    r = CliRunner().invoke(app, ["compile", "torchvision:densenet121", "--device", "cpu"])
    assert r.exit_code != 0 and "torchvision is not installed" in r.output


def test_cli_compiles_a_torchvision_model(fake_tv: types.ModuleType, tmp_path: Any) -> None:
    report = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["compile", "tv:densenet121", "--image-size", "9", "--batch", "2", "--device", "cpu",
                                 "--report", str(report)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "max_rel_err" in r.output and report.exists()


@pytest.mark.gpu
def test_bench_a_torchvision_model_on_the_gpu(tmp_path: Any) -> None:
    pytest.importorskip("torchvision")
    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["bench", "torchvision:squeezenet1_1", "--batch", "2", "--image-size", "64", "--baselines", "eager",
                                 "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    import json

    rec = json.loads(out.read_text())[0]
    assert rec["case"] == "B2_64px" and rec["max_rel_err"] < 5e-2
