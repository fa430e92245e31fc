"""Attention recognition on imported HF graphs (SDPA and explicit forms), QKV merge, norm fusion."""

import pytest
import torch

import kfuse
import kfuse.models
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_attention import fuse_attention
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.passes.fuse_norm import fuse_norms
from kfuse.passes.merge_gemm import merge_gemms

BASE = Options(fuse_attention=False, fuse_epilogue=False, fuse_pointwise=False, varlen=False, layout="nchw")


def _imported(model, args, kwargs):
    g = optimize(import_module(model, args, kwargs).graph, BASE).graph
    return g, list(args) + list(kwargs.values())


def _close(g1, g2, xs, atol=1e-5):
    for a, b in zip(reference_run(g1, xs), reference_run(g2, xs), strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-4)


def _fused(g):
    return [n for n in g.nodes if n.op == "fused_attention"]


@pytest.mark.parametrize(
    "name,mask,kind,causal",
    [
        ("bert-tiny", False, "none", False),
        ("bert-tiny", True, "padding", False),
        ("gpt2-tiny", True, "padding", True),
        ("gpt2-tiny", False, "none", True),
    ],
)
def test_sdpa_models(name, mask, kind, causal, device):
    m, a, k = kfuse.models.build(name, batch=2, seq=9, with_mask=mask, device=device)
    g, xs = _imported(m, a, k)
    g2 = fuse_attention(g)
    nodes = _fused(g2)
    assert len(nodes) == 2  # one per layer
    for n in nodes:
        assert n.attrs["mask_kind"] == kind and n.attrs["causal"] == causal and n.attrs["layout"] == "bshd"
    assert "sdpa" not in g2.op_counts()
    _close(g, g2, xs)


def test_vit_sdpa(device):
    m, a, k = kfuse.models.build("vit-tiny", batch=2, device=device)
    g, xs = _imported(m, a, k)
    g2 = fuse_attention(g)
    assert len(_fused(g2)) == 2 and all(n.attrs["mask_kind"] == "none" for n in _fused(g2))
    _close(g, g2, xs)


def _eager_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, attn_implementation="eager"
    )
    return BertModel(cfg).eval()


def test_explicit_matmul_softmax_form(device):
    m = _eager_bert().to(device)
    ids = torch.randint(0, 64, (2, 7), device=device)
    mask = torch.ones(2, 7, dtype=torch.long, device=device)
    mask[1, 4:] = 0
    g, xs = _imported(m, (ids,), {"attention_mask": mask})
    assert "softmax" in g.op_counts()
    g2 = fuse_attention(g)
    nodes = _fused(g2)
    assert len(nodes) == 2 and all(n.attrs["mask_kind"] == "padding" for n in nodes)
    assert "softmax" not in g2.op_counts()
    _close(g, g2, xs)


class _ArbitraryMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 48)

    def forward(self, x, keep):
        b, s, _ = x.shape
        q, k, v = self.proj(x).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
        mask = keep[:, None, :, :] > 0.5  # a per-query pattern: not a padding mask
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return o.transpose(1, 2).reshape(b, s, 16)


def test_arbitrary_mask_falls_back_to_dense_with_note(device, monkeypatch):
    # kfuse's attention kernel on a GPU too, where the lowering would time it against SDPA and may keep
    # SDPA (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    torch.manual_seed(1)
    model = _ArbitraryMask().to(device).eval()
    x = torch.randn(2, 5, 16, device=device)
    keep = torch.rand(2, 5, 5, device=device)
    keep[..., 0] = 1.0
    compiled = kfuse.compile(model, (x, keep))
    kernels = [k for k in compiled.report["kernels"] if k["template"] == "fused_attention"]
    assert len(kernels) == 1
    assert "mask=dense" in kernels[0]["config"] and "note:" in kernels[0]["config"]
    torch.testing.assert_close(compiled(x, keep), model(x, keep), atol=1e-4, rtol=1e-4)


def test_merge_qkv_and_norm_fusion(device):
    m, a, k = kfuse.models.build("bert-tiny", batch=2, seq=5, device=device)
    g, xs = _imported(m, a, k)
    n_mm = g.op_counts()["matmul"]
    g2 = merge_gemms(fuse_attention(g))
    assert g2.op_counts()["matmul"] == n_mm - 2 * 2  # Q, K, V -> one GEMM per layer
    merged = [c for n, c in g2.constants.items() if n.startswith("w_merged")]
    assert merged and all(c.shape == (128, 384) for c in merged)
    g3 = fuse_norms(fuse_epilogues(g2))
    counts = g3.op_counts()
    assert "layer_norm" not in counts and counts["fused_norm"] == 5
    emb = next(n for n in g3.nodes if n.op == "fused_norm")
    assert emb.attrs["n_add"] == 2  # word + token-type + position embeddings in one kernel
    _close(g, g3, xs)
    # Q, K, V are last-dim slices of the merged GEMM's output that feed attention directly, with no
    # copy or reshape between them, so the kernel reads the merged buffer through strides
    nodes, users = g3.node_map(), g3.users()
    slices = [n for n in g3.nodes if n.op == "slice"]
    assert len(slices) == 3 * 2
    for s in slices:
        assert nodes[s.inputs[0]].op == "gemm_epilogue" and all(u.op == "slice" for u in users[s.inputs[0]])
        assert [u.op for u in users[s.name]] == ["fused_attention"]
    for att in _fused(g3):
        qkv = [nodes[i] for i in att.inputs[:3]]
        assert [n.op for n in qkv] == ["slice"] * 3 and len({n.inputs[0] for n in qkv}) == 1
        assert [(n.attrs["start"], n.attrs["end"]) for n in qkv] == [(0, 128), (128, 256), (256, 384)]


class _ChannelsFirstAttention(torch.nn.Module):
    """SqueezeBERT's layout: projections are 1x1 convs on (B, C, S), so q, k and v reach attention as
    views whose head dim is strided (session 35: the compile failed with "q must be contiguous in the head
    dim"), and the explicit matmul-softmax form is the one HF writes."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Conv1d(16, 16, 1) for _ in range(3))

    def forward(self, x):  # x: (B, C, S)
        b, c, s = x.shape

        def heads(t):
            return t.view(b, 2, 8, s).permute(0, 1, 3, 2)  # (B, H, S, D), head dim strided by S

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return o.permute(0, 1, 3, 2).reshape(b, c, s)


def test_attention_on_head_dim_strided_views(device):
    m = _ChannelsFirstAttention().to(device).eval()
    x = torch.randn(2, 16, 11, device=device)
    cm = kfuse.compile(m, (x,))
    assert any(k["template"] in ("fused_attention", "library_attention") for k in cm.report["kernels"])
    torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


class _WhereCausalAttention(torch.nn.Module):
    """GPT-Neo / GPT-J / CodeGen: ``where(tril[:, :, :S, :S], q @ k^T, finfo.min)``, then the scale (GPT-J
    divides after the where, GPT-Neo has none), plus HF's additive padding mask."""

    def __init__(self, scale: float | None, lower: bool = True) -> None:
        super().__init__()
        tri = torch.ones(32, 32, dtype=torch.bool)
        self.register_buffer("bias", (tri.tril() if lower else tri.triu()).view(1, 1, 32, 32))
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s = q.shape[2]
        w = torch.where(self.bias[:, :, :s, :s], q @ k.transpose(-1, -2), torch.tensor(torch.finfo(q.dtype).min))
        if self.scale is not None:
            w = w / self.scale
        return torch.softmax(w + mask, dim=-1) @ v


@pytest.mark.parametrize("scale", [None, 4.0])
def test_where_causal_mask_is_fused_as_causal(scale):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 16) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 12)
    mask[1, ..., -3:] = torch.finfo(torch.float32).min  # right padding: no query row loses every key
    model = _WhereCausalAttention(scale)
    g, xs = _imported(model, (q, k, v, mask), {})
    fused = _fused(fuse_attention(g))
    assert len(fused) == 1 and fused[0].attrs["causal"] and "where" in fused[0].attrs["fused_ops"], fused
    assert fused[0].attrs["scale"] == pytest.approx(1.0 / scale if scale else 1.0)
    cm = kfuse.compile(model, (q, k, v, mask), check=False)
    torch.testing.assert_close(cm(q, k, v, mask), model(q, k, v, mask), atol=1e-5, rtol=1e-4)


def test_a_non_causal_where_beside_a_real_additive_mask_is_not_fused():
    # the kernel takes one mask: a constant "may attend" pattern and an input's additive mask are two
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = torch.zeros(1, 1, 1, 8)
    model = _WhereCausalAttention(None, lower=False)  # an upper-triangular condition: not the causal mask
    g, xs = _imported(model, (q, k, v, mask), {})
    assert not _fused(fuse_attention(g))
    cm = kfuse.compile(model, (q, k, v, mask), check=False)
    torch.testing.assert_close(cm(q, k, v, mask), model(q, k, v, mask), atol=1e-5, rtol=1e-4)


class _AlibiMaskedFillAttention(torch.nn.Module):
    """MPT: ``masked_fill(triu(1), finfo.min)`` over the scaled scores plus an ALiBi bias ``[H, 1, Sk]``."""

    def __init__(self, heads: int, seq: int) -> None:
        super().__init__()
        self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1).view(1, 1, seq, seq).expand(2, 1, seq, seq).clone())
        slopes = torch.tensor([2.0 ** (-(i + 1)) for i in range(heads)])
        self.register_buffer("alibi", (slopes[:, None, None] * torch.arange(seq)[None, None, :]).float())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        w = (q @ k.transpose(-1, -2)) * 0.25 + self.alibi
        w = w.masked_fill(self.future, torch.finfo(q.dtype).min)
        return torch.softmax(w, dim=-1) @ v


def test_masked_fill_causal_over_an_alibi_bias_is_fused():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 16) for _ in range(3))
    model = _AlibiMaskedFillAttention(4, 12)
    g, xs = _imported(model, (q, k, v), {})
    fused = _fused(fuse_attention(g))
    assert len(fused) == 1 and fused[0].attrs["causal"] and fused[0].attrs["scale"] == pytest.approx(0.25), fused
    cm = kfuse.compile(model, (q, k, v), check=False)
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), atol=1e-5, rtol=1e-4)


class _LocalWindowAttention(torch.nn.Module):
    """GPT-Neo's local layers: ``where(window, q @ k^T, finfo.min)`` with a constant causal window of 4 keys, and
    HF's additive padding mask built from an all-ones attention mask (which means nothing)."""

    def __init__(self) -> None:
        super().__init__()
        tri = torch.ones(32, 32, dtype=torch.bool).tril()
        self.register_buffer("bias", (tri & ~tri.tril(-4)).view(1, 1, 32, 32))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q.shape[2]
        w = torch.where(self.bias[:, :, :s, :s], q @ k.transpose(-1, -2), torch.tensor(torch.finfo(q.dtype).min))
        pad = (1.0 - torch.ones(q.shape[0], 1, 1, s)) * torch.finfo(q.dtype).min
        return torch.softmax(w + pad, dim=-1) @ v


def test_a_constant_window_where_is_the_kernels_bool_mask():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 16) for _ in range(3))
    model = _LocalWindowAttention()
    g, xs = _imported(model, (q, k, v), {})
    fused = _fused(fuse_attention(g))
    assert len(fused) == 1 and not fused[0].attrs["causal"] and fused[0].attrs["mask_kind"] == "dense", fused
    cm = kfuse.compile(model, (q, k, v), check=False)
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), atol=1e-5, rtol=1e-4)


class _CosineAttention(torch.nn.Module):
    """Swin-V2: normalised Q and K, the scores times a learned per-head scale ``exp(clamp(logit_scale))``
    ``[H, 1, 1]``, plus a relative-position bias ``[1, H, S, S]``."""

    def __init__(self, heads: int, seq: int) -> None:
        super().__init__()
        self.logit_scale = torch.nn.Parameter(torch.log(10 * torch.rand(heads, 1, 1) + 1))
        self.bias = torch.nn.Parameter(torch.randn(1, heads, seq, seq))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        f = torch.nn.functional
        w = f.normalize(q, dim=-1) @ f.normalize(k, dim=-1).transpose(-2, -1)
        w = w * torch.clamp(self.logit_scale, max=4.6052).exp() + self.bias
        return torch.softmax(w, dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_per_head_scale_of_the_scores_goes_on_q(dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 16, dtype=dtype) for _ in range(3))
    model = _CosineAttention(3, 10).to(dtype)
    g, xs = _imported(model, (q, k, v), {})
    fused = _fused(fuse_attention(g))
    assert len(fused) == 1 and fused[0].attrs["scale"] == 1.0 and fused[0].attrs["mask_kind"] == "dense", fused
    cm = kfuse.compile(model, (q, k, v), check=False)
    assert [kk["template"] for kk in cm.report["kernels"]].count("fused_attention") == 1
    tol = 1e-4 if dtype == torch.float32 else 3e-3
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), atol=tol, rtol=tol)


class _UpcastScoresAttention(torch.nn.Module):
    """GPT-Neo: Q and K cast to fp32 for the scores, the probabilities cast back to V's dtype."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q.shape[2]
        w = q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2)
        keep = torch.ones(s, s, dtype=torch.bool).tril()
        w = torch.where(keep, w, torch.tensor(torch.finfo(torch.float32).min))
        return torch.softmax(w, dim=-1).to(v.dtype) @ v


def test_q_and_k_cast_up_for_the_scores_are_read_in_their_own_dtype():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 13, 16, dtype=torch.float16) for _ in range(3))
    model = _UpcastScoresAttention()
    g, xs = _imported(model, (q, k, v), {})
    fused = _fused(fuse_attention(g))
    assert len(fused) == 1 and fused[0].attrs["causal"], fused
    cm = kfuse.compile(model, (q, k, v), check=False)
    assert [kk["template"] for kk in cm.report["kernels"]].count("fused_attention") == 1
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), atol=3e-3, rtol=3e-3)


def test_mixed_qkv_dtypes_stay_unfused():
    """K cast after its transpose is not the peeled form: the fp32 Q, K and fp16 V must not reach the kernel."""

    class _CastAfterTranspose(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax(q.to(torch.float32) @ k.transpose(-1, -2).to(torch.float32), dim=-1).to(v.dtype) @ v

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float16) for _ in range(3))
    model = _CastAfterTranspose()
    g, _ = _imported(model, (q, k, v), {})
    assert not _fused(fuse_attention(g))
    cm = kfuse.compile(model, (q, k, v), check=False)
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), atol=3e-3, rtol=3e-3)


class _MaskThenScale(torch.nn.Module):
    """CodeGen's order: the mask added to the raw scores, the sum scaled (``factor``), then the softmax; the
    mask from the input, shared by two attentions."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, q1: torch.Tensor, q2: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = v
        for q in (q1, q2):
            s = (q @ k.transpose(-1, -2) + mask) * self.factor
            out = torch.softmax(s, dim=-1) @ out
        return out


@pytest.mark.parametrize("factor,fused", [(0.25, 2), (1.0, 2), (-0.5, 2), (4.0, 0)])
def test_a_scale_after_the_mask_moves_onto_scores_and_mask(factor, fused, device):
    gen = torch.Generator().manual_seed(3)
    q1, q2, k, v = (torch.randn(2, 3, 7, 8, generator=gen).to(device) for _ in range(4))
    mask = torch.where(torch.rand(2, 1, 7, 7, generator=gen) < 0.3, torch.finfo(torch.float32).min, 0.0).to(device)
    model = _MaskThenScale(factor)
    g, xs = _imported(model, (q1, q2, k, v, mask), {})
    r = fuse_attention(g)
    assert len(_fused(r)) == fused
    if fused:  # one scaled mask for both attentions (none where the simplifier dropped the * 1)
        assert sum(n.op == "mul" and n.inputs[0] == "mask" for n in r.nodes) == int(factor != 1.0)
    _close(g, r, xs)


class _ScaledQuery(torch.nn.Module):
    """OPT's / Whisper's attention: the query projection times ``head_dim ** -0.5``, the heads split, SDPA at
    ``scale`` (``form``: "mul", "div", "default" (SDPA's own 1/sqrt(d) on top), "shared" (the scaled query
    is also an output: the multiply stays))."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        q = self.q(x) / 2.0 if self.form == "div" else self.q(x) * 0.25
        heads = [t.view(b, s, 2, 16).transpose(1, 2) for t in (q, self.k(x), self.v(x))]
        out = torch.nn.functional.scaled_dot_product_attention(*heads, scale=None if self.form == "default" else 1.0)
        return (out, q) if self.form == "shared" else out


@pytest.mark.parametrize("form,folded", [("mul", True), ("div", True), ("default", True), ("shared", False)])
def test_the_query_scale_folds_into_the_attention(form, folded, device):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 9, 32, generator=gen).to(device)
    model = _ScaledQuery(form).to(device).eval()
    g, xs = _imported(model, (x,), {})
    r = fuse_attention(g)
    (att,) = _fused(r)
    assert ("mul" in att.attrs["fused_ops"] or "div" in att.attrs["fused_ops"]) == folded
    assert any(n.op in ("mul", "div") for n in r.nodes) == (not folded)
    want = {"mul": 0.25, "div": 0.5, "default": 0.25 / 4.0, "shared": 1.0}[form]
    assert att.attrs["scale"] == pytest.approx(want)
    _close(g, r, xs)
