"""Which attention kernel a plan runs: the split-KV decode kernel for a few query rows over a long cache, the
dense kernel for a prefill's square attention (without a GPU to measure on; on one, the fastest of both and
PyTorch's SDPA)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kfuse

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class _Step(nn.Module):
    """A decode step's attention: the new token's query from a projection ([B, 1, H*D] heads split), the
    cache's keys and values as inputs, a bool mask over the cache's slots."""

    def __init__(self, heads: int = 4, kv_heads: int = 2, dim: int = 16) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        self.q = nn.Linear(heads * dim, heads * dim)
        self.gqa = kv_heads != heads

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.gqa)
        return o.transpose(1, 2).reshape(b, s, -1)


def _inputs(b: int, sq: int, sk: int, kv_heads: int = 2, dim: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, sq, 4 * dim, generator=g)
    k, v = (torch.randn(b, kv_heads, sk, dim, generator=g) for _ in range(2))
    mask = torch.arange(sk)[None, None, None, :] < torch.tensor([sk - 9, sk - 2])[:b, None, None, None]
    return tuple(t.to(DEVICE) for t in (x, k, v, mask))


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_decode_step_runs_the_decode_kernel(kv_heads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")  # kfuse's kernels only: on a GPU, decode vs dense is measured
    model = _Step(kv_heads=kv_heads).eval().to(DEVICE)
    args = _inputs(2, 1, 40, kv_heads)
    compiled = kfuse.compile(model, args)
    templates = [k["template"] for k in compiled.report["kernels"]]
    if DEVICE == "cpu":
        assert "decode_attention" in templates and "fused_attention" not in templates, templates
    else:  # timed: either kfuse kernel, with both times in its config
        (att,) = [k for k in compiled.report["kernels"] if k["template"] in ("decode_attention", "fused_attention")]
        assert "kfuse decode kernel" in att["config"] and "kfuse kernel" in att["config"], att
        assert "merged by its last program" in att["config"], att  # the one-launch form was raced too (and checked)
    new = _inputs(2, 1, 40, kv_heads)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*new), model(*new), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("sq,sk", [(12, 12), (2, 6)])
def test_square_or_short_attention_keeps_the_dense_kernel(sq: int, sk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    model = _Step().eval().to(DEVICE)
    compiled = kfuse.compile(model, _inputs(2, sq, sk))
    templates = [k["template"] for k in compiled.report["kernels"]]
    assert "fused_attention" in templates and "decode_attention" not in templates, templates
