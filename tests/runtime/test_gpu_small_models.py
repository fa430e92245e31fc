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
