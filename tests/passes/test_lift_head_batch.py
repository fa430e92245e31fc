"""Attention over a merged (B*H, S, D) batch (BLOOM, XGLM): lifted to the 4-D chain, then fused."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_attention import fuse_attention
from kfuse.passes.lift_head_batch import lift_head_batch

BASE = Options(fuse_attention=False, fuse_epilogue=False, fuse_pointwise=False, fuse_b2b=False, tune="none")


class _BloomAttention(torch.nn.Module):
    """BLOOM: ``baddbmm(alibi, q, k^T)`` over ``(B*H, S, D)``, a split for the causal / padding mask, softmax,
    a merge for ``bmm`` with V."""

    def __init__(self, heads: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        slopes = torch.tensor([2.0 ** (-(i + 1)) for i in range(heads)])
        self.register_buffer("alibi", (slopes[:, None, None] * torch.arange(seq)[None, None, :]).float())  # [H, 1, S]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        alibi = self.alibi.repeat(b, 1, 1)  # [B*H, 1, S]
        scores = alibi.baddbmm(q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2), beta=1.0, alpha=d**-0.5)
        w = scores.view(b, h, s, s) + mask
        p = torch.softmax(w, dim=-1).view(b * h, s, s)
        return torch.bmm(p, v.reshape(b * h, s, d)).view(b, h, s, d)


class _BloomCausalOnly(_BloomAttention):
    """BLOOM called without a padding mask: its causal mask is built in the model, a constant."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        s = q.shape[2]
        causal = torch.full((s, s), torch.finfo(q.dtype).min, device=q.device).triu(1)
        return super().forward(q, k, v, causal)


class _XglmAttention(torch.nn.Module):
    """XGLM: pre-scaled queries, ``bmm`` scores split for the mask, merged back, floored at ``finfo.min``,
    softmax over the merged batch."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        w = torch.bmm((q * d**-0.5).reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2))
        w = (w.view(b, h, s, s) + mask).view(b * h, s, s)
        w = torch.max(w, torch.full((), torch.finfo(w.dtype).min))
        out = torch.bmm(torch.softmax(w, dim=-1), v.reshape(b * h, s, d))
        return out.view(b, h, s, d).transpose(1, 2).reshape(b, s, h * d)


def _inputs(b: int = 2, h: int = 3, s: int = 10, d: int = 16) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    causal = torch.full((s, s), torch.finfo(torch.float32).min).triu(1)
    padding = torch.zeros(b, 1, 1, s)
    padding[1, ..., -3:] = torch.finfo(torch.float32).min  # the second sequence is 3 shorter
    return q, k, v, (causal + padding).clamp_min(torch.finfo(torch.float32).min)


def _graph(model: torch.nn.Module, xs: tuple[torch.Tensor, ...]):
    return optimize(import_module(model, xs, {}).graph, BASE).graph


def test_lifting_leaves_no_merged_batch_matmul_and_keeps_the_numbers() -> None:
    for model in (_BloomAttention(3, 10), _XglmAttention()):
        xs = _inputs()
        g = _graph(model, xs)
        assert any(n.op == "matmul" and n.ttype.rank == 3 for n in g.nodes)
        lifted = lift_head_batch(g)
        left_3d = [n for n in lifted.nodes if n.op in ("matmul", "softmax") and n.ttype.rank == 3]
        assert not left_3d, left_3d
        for got, want in zip(reference_run(lifted, list(xs)), reference_run(g, list(xs)), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_bloom_attention_is_fused_with_alibi_and_mask_both_read_by_the_kernel() -> None:
    model, xs = _BloomAttention(3, 10), _inputs()
    fused = [n for n in fuse_attention(lift_head_batch(_graph(model, xs))).nodes if n.op == "fused_attention"]
    assert len(fused) == 1 and fused[0].attrs["mask_kind"] == "dense" and fused[0].attrs.get("mask2"), fused
    assert len(fused[0].inputs) == 5  # ALiBi and the mask, never summed in memory
    cm = kfuse.compile(model, xs, check=False)
    assert [k["template"] for k in cm.report["kernels"]].count("fused_attention") == 1, cm.report["kernels"]
    torch.testing.assert_close(cm(*xs), model(*xs), atol=1e-5, rtol=1e-4)


def test_a_causal_only_second_mask_is_the_causal_flag_not_a_sum() -> None:
    model, xs = _BloomCausalOnly(3, 10), _inputs()[:3]
    g = fuse_attention(lift_head_batch(_graph(model, xs)))
    fused = [n for n in g.nodes if n.op == "fused_attention"]
    assert len(fused) == 1 and fused[0].attrs["causal"] and fused[0].attrs["mask_kind"] == "dense", fused
    assert not any(n.name.endswith("_mask") for n in g.nodes)  # ALiBi alone is the mask: nothing summed
    cm = kfuse.compile(model, xs, check=False)
    torch.testing.assert_close(cm(*xs), model(*xs), atol=1e-5, rtol=1e-4)


def test_xglm_attention_is_fused_through_its_finfo_min_floor() -> None:
    model, xs = _XglmAttention(), _inputs()
    cm = kfuse.compile(model, xs, check=False)
    assert [k["template"] for k in cm.report["kernels"]].count("fused_attention") == 1, cm.report["kernels"]
    torch.testing.assert_close(cm(*xs), model(*xs), atol=1e-5, rtol=1e-4)


class _NotHeads(torch.nn.Module):
    """A 3-D bmm of real 3-D inputs (no head split to lift) next to a merged one with a mismatched batch."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.bmm(a, b).softmax(-1), torch.bmm(x.reshape(6, 4, 5), b[:, :5, :].repeat(2, 1, 1))


def test_batched_matmuls_that_are_not_merged_heads_stay_3d() -> None:
    torch.manual_seed(0)
    xs = (torch.randn(3, 4, 5), torch.randn(3, 5, 7), torch.randn(2, 3, 4, 5))
    g = _graph(_NotHeads(), xs)
    lifted = lift_head_batch(g)
    assert [n.ttype.rank for n in lifted.nodes if n.op == "matmul"] == [3, 3]
    for got, want in zip(reference_run(lifted, list(xs)), reference_run(g, list(xs)), strict=True):
        torch.testing.assert_close(got, want)


class _DebertaAttention(torch.nn.Module):
    """DeBERTa-v2: K^T scaled before a merged ``bmm``, then ``masked_fill(~mask, finfo.min)`` with the mask
    from the input (here key padding, ``[B, 1, 1, S]``)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        kt = k.reshape(b * h, s, d).transpose(-1, -2) * d**-0.5
        w = torch.bmm(q.reshape(b * h, s, d), kt).view(b, h, s, s)
        w = w.masked_fill(~keep[:, None, None, :].bool(), torch.finfo(w.dtype).min)
        return torch.softmax(w, dim=-1) @ v


def test_deberta_attention_is_fused_with_its_scaled_k_and_masked_fill() -> None:
    q, k, v, _ = _inputs()
    keep = torch.ones(2, 10, dtype=torch.long)
    keep[1, -4:] = 0
    model = _DebertaAttention()
    g = fuse_attention(lift_head_batch(_graph(model, (q, k, v, keep))))
    fused = [n for n in g.nodes if n.op == "fused_attention"]
    assert len(fused) == 1 and fused[0].attrs["scale"] == 0.25 and fused[0].attrs["mask_kind"] in ("padding", "dense"), fused
    cm = kfuse.compile(model, (q, k, v, keep), check=False)
    torch.testing.assert_close(cm(q, k, v, keep), model(q, k, v, keep), atol=1e-5, rtol=1e-4)
    keep2 = torch.ones(2, 10, dtype=torch.long)
    keep2[0, -2:] = 0  # another padding pattern through the same compiled model
    torch.testing.assert_close(cm(q, k, v, keep2), model(q, k, v, keep2), atol=1e-5, rtol=1e-4)


class _TwoMergedOperands(torch.nn.Module):
    """Scores and a per-head bias both merged to (B*H, S, S) before they are added."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        w = torch.bmm(q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2)) + bias.reshape(b * h, s, s)
        return torch.bmm(torch.softmax(w, dim=-1), v.reshape(b * h, s, d)).view(b, h, s, d)


def test_an_add_of_two_merges_is_lifted_and_fused() -> None:
    q, k, v, _ = _inputs()
    bias = torch.randn(2, 3, 10, 10)
    model = _TwoMergedOperands()
    g = fuse_attention(lift_head_batch(_graph(model, (q, k, v, bias))))
    assert [n.op for n in g.nodes].count("fused_attention") == 1
    cm = kfuse.compile(model, (q, k, v, bias), check=False)
    torch.testing.assert_close(cm(q, k, v, bias), model(q, k, v, bias), atol=1e-5, rtol=1e-4)


class _StackedQkvAttention(torch.nn.Module):
    """ViTDet / SAM: one qkv projection viewed as ``(3, B*H, S, D)`` and unbound, Q scaled before ``q @ k^T``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4).reshape(3, b * self.heads, s, -1).unbind(0)
        p = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return (p @ v).view(b, self.heads, s, -1).permute(0, 2, 1, 3).reshape(b, s, c)


def test_q_k_v_unbound_from_a_stacked_merge_are_lifted_and_fused() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 13, 48)
    model = _StackedQkvAttention(48, 3)
    g = optimize(import_module(model, (x,), {}).graph, BASE).graph
    assert not [n for n in fuse_attention(g).nodes if n.op == "fused_attention"]  # 3-D: not matched as imported
    lifted = lift_head_batch(g)
    torch.testing.assert_close(reference_run(lifted, [x])[0], reference_run(g, [x])[0])
    fused = [n for n in fuse_attention(lifted).nodes if n.op == "fused_attention"]
    assert len(fused) == 1 and abs(fused[0].attrs["scale"] - 16**-0.5) < 1e-7, fused  # Q's scale went into the kernel
    cm = kfuse.compile(model, (x,), check=False)
    assert [k["template"] for k in cm.report["kernels"]].count("fused_attention") == 1
    torch.testing.assert_close(cm(x), model(x), atol=1e-5, rtol=1e-4)


class _WavLMAttention(torch.nn.Module):
    """WavLM: ``F.multi_head_attention_forward`` sequence-first, with separate Q / K / V projections, the weights
    asked for (and dropped), and a gated relative bias ``[B*H, S, S]`` as a float mask."""

    def __init__(self, e: int, h: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(e, e) for _ in range(4))
        self.h = h

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        xs = x.transpose(0, 1)
        out, _ = F.multi_head_attention_forward(
            xs, xs, xs, xs.shape[-1], self.h, torch.empty([0]), torch.cat((self.q.bias, self.k.bias, self.v.bias)), None, None, False,
            0.0, self.o.weight, self.o.bias, False, None, need_weights=True, attn_mask=bias, use_separate_proj_weight=True,
            q_proj_weight=self.q.weight, k_proj_weight=self.k.weight, v_proj_weight=self.v.weight,
        )  # fmt: skip
        return out.transpose(0, 1)


def test_sequence_first_heads_with_separate_projections_are_lifted_and_fused() -> None:
    torch.manual_seed(0)
    b, s, e, h = 2, 7, 24, 3
    m = _WavLMAttention(e, h).eval()
    xs = (torch.randn(b, s, e), torch.randn(b * h, s, s))
    g = _graph(m, xs)
    lifted = lift_head_batch(g)
    assert not [n for n in lifted.nodes if n.op in ("matmul", "softmax") and n.ttype.rank == 3 and n.ttype.shape[0] == b * h]
    torch.testing.assert_close(reference_run(lifted, list(xs))[0], reference_run(g, list(xs))[0], atol=1e-5, rtol=1e-4)
    cm = kfuse.compile(m, xs)
    assert [k["template"] for k in cm.report["kernels"]].count("fused_attention") == 1, cm.report["kernels"]
    torch.testing.assert_close(cm(*xs), m(*xs), atol=1e-5, rtol=1e-4)
