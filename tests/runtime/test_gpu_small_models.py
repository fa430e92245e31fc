"""The demo's small models compiled on the GPU, as ``kfuse demo --model ... --batch ...`` does (fp16,
default tuning), checked against PyTorch: problems far smaller than any tile go through the same
tuner, templates and CUDA graph as the big ones."""

from __future__ import annotations

import pytest
import torch

import kfuse
import kfuse.models as zoo


@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", [("mlp-tiny", 1), ("mlp-tiny", 2), ("bert-tiny", 2)])
def test_small_model_compiles_and_matches_on_the_gpu(name: str, batch: int) -> None:
    torch.manual_seed(0)
    m, args, kwargs = zoo.build(name, batch=batch, seq=16, dtype=torch.float16, device="cuda")
    compiled = kfuse.compile(m, args, kwargs)
    with torch.no_grad():
        want = m(*args, **kwargs)
        got = compiled(*args, **kwargs)
        again = compiled(*args, **kwargs)  # a CUDA-graph replay after the first call
    torch.cuda.synchronize()
    want_t = want if isinstance(want, torch.Tensor) else want[0]
    for g in (got, again):
        g_t = g if isinstance(g, torch.Tensor) else g[0]
        err = float((g_t.float() - want_t.float()).abs().max() / want_t.float().abs().max())
        assert err < 2e-2, (name, batch, err)
    assert compiled.report["max_rel_err"] <= 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["densenet", "inception"])
def test_torchvision_cat_models_on_the_gpu(arch: str) -> None:
    """torchvision's own DenseNet (small config) and an Inception-v3 block in fp16 with every measured choice on:
    the cats as views of one buffer, members computed in place or copied as their conv's race went, the batch
    norm + ReLU in the 1x1 convs' loads, all under the CUDA graph."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    if arch == "densenet":
        m = tv.models.DenseNet(growth_rate=8, block_config=(3, 3), num_init_features=16, bn_size=2, num_classes=10)
        x = torch.randn(4, 3, 40, 40)
    else:
        m = tv.models.inception.InceptionE(64)
        x = torch.randn(4, 64, 9, 9)
    with torch.no_grad():  # measured-looking statistics, so fp16 stays in range
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
    m = m.eval().cuda().half()
    x = x.cuda().half()
    compiled = kfuse.compile(m, (x,))
    assert compiled.report["concat_in_place"]["view_cats"] >= (6 if arch == "densenet" else 3)
    with torch.no_grad():
        want = m(x).float()
        for _ in range(2):  # the capture's first run and a replay
            got = compiled(x).float()
            assert float((got - want).abs().max() / want.abs().max()) < 2e-2
