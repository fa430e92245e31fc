"""A decode step's query rotary folded into the decode attention kernel (``kfuse.passes.fuse_query_rotary``):
results equal eager's step after step; the fold only where the decode kernel runs and the rotated query has no
other reader; the option turns it off."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kfuse

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-5


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class _Decoder(nn.Module):
    """One attention layer over a static cache of ``slots`` rows (buffers), grouped-query (4 query heads, 2 kv)."""

    def __init__(self, slots: int = 40, keep_rotated_query: bool = False) -> None:
        super().__init__()
        self.heads, self.kv, self.dim, self.slots = 4, 2, 8, slots
        self.q = nn.Linear(16, 32)
        self.kv_proj = nn.Linear(16, 32)
        self.register_buffer("k", torch.randn(1, self.kv, slots, self.dim))
        self.register_buffer("v", torch.randn(1, self.kv, slots, self.dim))
        self.keep = keep_rotated_query

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k, v = (z.view(b, t, self.kv, self.dim).transpose(1, 2) for z in self.kv_proj(x).chunk(2, -1))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        mask = torch.arange(self.slots, device=x.device)[None, None, None, :] <= pos[-1]
        o = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask, enable_gqa=True)
        out = o.transpose(1, 2).reshape(b, t, -1)
        return out + q.sum() if self.keep else out


def _inputs(step: int, t: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(step)
    angle = torch.randn(1, 1, t, 8, generator=g)
    pos = torch.arange(step, step + t)
    return tuple(z.to(DEVICE) for z in (torch.randn(1, t, 16, generator=g), pos, angle.cos(), angle.sin()))


def _compiled(t: int = 1, slots: int = 40, keep: bool = False, **options: object) -> kfuse.CompiledModel:
    torch.manual_seed(0)
    model, eager = _Decoder(slots, keep).eval().to(DEVICE), _Decoder(slots, keep).eval().to(DEVICE)
    eager.load_state_dict(model.state_dict())
    compiled = kfuse.compile(model, _inputs(0, t), **options)
    for step in range(3):
        args = _inputs((step * t) % (slots - t + 1), t)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), eager(*args), rtol=TOL, atol=TOL)
        torch.testing.assert_close(model.k, eager.k, rtol=TOL, atol=TOL)
    return compiled


def _attention(compiled: kfuse.CompiledModel) -> list:
    return [n for n in compiled.plan.graph.nodes if n.op == "fused_attention"]


def test_the_query_rotary_folds_into_the_decode_kernel() -> None:
    compiled = _compiled()
    (attn,) = _attention(compiled)
    assert attn.attrs["q_rotary"] == {"rotary_dims": None, "interleaved": False}
    assert not any(n.op == "rotary" for n in compiled.plan.graph.nodes)  # the key's is in its cache write
    (k,) = [k for k in compiled.report["kernels"] if "attention" in k["template"]]
    assert "query rotary folded in" in k["config"] and "neg" in k["ops"]
    if DEVICE == "cpu":  # on a GPU the lowering times the decode kernel against the dense one and SDPA
        assert k["template"] == "decode_attention"


@pytest.mark.parametrize("case", ["option_off", "prefill_shape", "second_reader"])
def test_it_stays_apart(case: str) -> None:
    kw: dict = {"option_off": {"fuse_query_rotary": False}, "prefill_shape": {"t": 8, "slots": 8}, "second_reader": {"keep": True}}[case]
    compiled = _compiled(**kw)
    assert not any(n.attrs.get("q_rotary") for n in _attention(compiled))
    assert [n.op for n in compiled.plan.graph.nodes].count("rotary") == 1  # the query's own rotary kernel
