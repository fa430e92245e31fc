"""Rotary-embedding recognition and grouped-query attention on imported Llama graphs, and the
rotate_half look-alikes that must be left alone."""

import pytest
import torch
import torch.nn as nn

import kfuse
import kfuse.models
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_attention import fuse_attention
from kfuse.passes.fuse_rotary import fuse_rotary

BASE = Options(fuse_attention=False, fuse_rotary=False, fuse_epilogue=False, fuse_pointwise=False, varlen=False, layout="nchw")


def _imported(model, args, kwargs=None):
    kwargs = kwargs or {}
    g = optimize(import_module(model, args, kwargs).graph, BASE).graph
    return g, list(args) + list(kwargs.values())


def _close(g1, g2, xs, atol=1e-5):
    for a, b in zip(reference_run(g1, xs), reference_run(g2, xs), strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-4)


def _ops(g, op):
    return [n for n in g.nodes if n.op == op]


def test_llama_rotary_q_and_k_of_every_layer(device):
    model, args, kwargs = kfuse.models.build("llama-tiny", batch=2, seq=9, seed=3, device=device)
    g, xs = _imported(model, args, kwargs)
    assert len(_ops(g, "cat")) == 4 and len(_ops(g, "neg")) == 4  # rotate_half of q and k, 2 layers
    r = fuse_rotary(g)
    assert len(_ops(r, "rotary")) == 4 and not _ops(r, "cat") and not _ops(r, "neg")
    _close(g, r, xs)


def test_llama_attention_reads_the_shared_kv_heads_and_writes_merged_heads(device):
    model, args, kwargs = kfuse.models.build("llama-tiny", batch=2, seq=9, seed=4, device=device)
    g, xs = _imported(model, args, kwargs)
    assert len(_ops(g, "expand")) == 4  # HF repeat_kv on k and v, 2 layers
    f = fuse_attention(fuse_rotary(g))
    att = _ops(f, "fused_attention")
    assert len(att) == 2 and not _ops(f, "expand")
    for n in att:
        a = n.attrs
        assert (a["kv_group"], a["layout"], a["out_layout"], a["causal"]) == (2, "bhsd", "bshd", True)
        assert n.ttype.shape == (2, 9, 128)  # [B, S, H*D]: the merge copy is gone
    _close(g, f, xs)


class _Rope(nn.Module):
    """rotate_half written three ways: HF's, a swapped concatenation (a different function) and one
    whose rotated half is also an output."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.proj = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):  # noqa: ANN201
        q = self.proj(x).view(x.shape[0], x.shape[1], 2, 32).transpose(1, 2)
        x1, x2 = q[..., :16], q[..., 16:]
        if self.form == "swapped":
            rot = torch.cat((x1, -x2), dim=-1)
        else:
            rot = torch.cat((-x2, x1), dim=-1)
        out = sin * rot + q * cos  # operands and products in the other order than HF's
        return (out, rot) if self.form == "shared" else out


@pytest.mark.parametrize("form,fused", [("hf", True), ("swapped", False), ("shared", False)])
def test_only_rotate_half_is_fused(form, fused, device):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 32, generator=gen).to(device)
    cos, sin = torch.rand(5, 32, generator=gen).to(device), torch.rand(5, 32, generator=gen).to(device)
    model = _Rope(form).to(device).eval()
    g, xs = _imported(model, (x, cos, sin))
    r = fuse_rotary(g)
    assert len(_ops(r, "rotary")) == int(fused)
    _close(g, r, xs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compiled_llama_runs_rotary_and_gqa_kernels(dtype, device, monkeypatch):
    # kfuse's attention kernel on a GPU too, where the lowering would time it against SDPA and may keep
    # SDPA (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    model, args, kwargs = kfuse.models.build("llama-tiny", batch=2, seq=11, seed=5, dtype=dtype, device=device)
    compiled = kfuse.compile(model, args, kwargs)
    rep = compiled.report
    templates = [k["template"] for k in rep["kernels"]]
    assert templates.count("rotary") == 4 and templates.count("fused_attention") == 2
    assert rep["max_rel_err"] < (2e-2 if dtype == torch.float16 else 1e-4)
    _, args2, _ = kfuse.models.build("llama-tiny", batch=2, seq=11, seed=6, dtype=dtype, device=device)
    with torch.no_grad():
        got, ref = compiled(*args2).last_hidden_state.float(), model(*args2).last_hidden_state.float()
    assert (got - ref).abs().max() / ref.abs().max() < (2e-2 if dtype == torch.float16 else 1e-4)
    off = kfuse.compile(model, args, kwargs, fuse_rotary=False)
    assert "rotary" not in [k["template"] for k in off.report["kernels"]]


class _PartialRope(nn.Module):
    """GPT-NeoX's partial rotary: rotate the first ``rot`` columns of each head, concatenate the rest back
    (``pass_from`` != rot: a look-alike whose concatenation skips columns, which must stay as it is)."""

    def __init__(self, rot: int, pass_from: int) -> None:
        super().__init__()
        self.rot, self.pass_from = rot, pass_from
        self.proj = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):  # noqa: ANN201
        q = self.proj(x).view(x.shape[0], x.shape[1], 2, 48).transpose(1, 2)
        q_rot, q_pass = q[..., : self.rot], q[..., self.pass_from :]
        x1, x2 = q_rot[..., : self.rot // 2], q_rot[..., self.rot // 2 :]
        emb = q_rot * cos + torch.cat((-x2, x1), dim=-1) * sin
        return torch.cat([emb, q_pass], dim=-1)


@pytest.mark.parametrize("rot,pass_from,absorbed", [(16, 16, True), (12, 12, True), (16, 20, False)])
def test_partial_rotary_absorbs_the_concatenation(rot, pass_from, absorbed, device):
    gen = torch.Generator().manual_seed(rot)
    x = torch.randn(2, 5, 32, generator=gen).to(device)
    cos, sin = torch.rand(5, rot, generator=gen).to(device), torch.rand(5, rot, generator=gen).to(device)
    model = _PartialRope(rot, pass_from).to(device).eval()
    g, xs = _imported(model, (x, cos, sin))
    r = fuse_rotary(g)
    rots = _ops(r, "rotary")
    assert len(rots) == 1
    assert (rots[0].attrs.get("rotary_dims") == rot) == absorbed
    assert len(_ops(r, "cat")) == (0 if absorbed else 1)
    _close(g, r, xs)


def test_compiled_partial_rotary_matches_eager(device):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 9, 32, generator=gen).to(device)
    cos, sin = torch.rand(9, 16, generator=gen).to(device), torch.rand(9, 16, generator=gen).to(device)
    model = _PartialRope(16, 16).to(device).eval()
    compiled = kfuse.compile(model, (x, cos, sin))
    rots = [k for k in compiled.report["kernels"] if k["template"] == "rotary"]
    assert len(rots) == 1 and "16 of 48 columns" in rots[0]["config"]
    x2 = torch.randn(2, 9, 32, generator=gen).to(device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2, cos, sin), model(x2, cos, sin), atol=1e-5, rtol=1e-4)


class _InterleavedRope(nn.Module):
    """GPT-J's rotate_every_two (stack of the rotated neighbours, then flatten), partial over the first
    ``rot`` columns; ``form``: "gptj", "swapped" (stack([x1, -x2]): a different function) or "shared" (the
    rotated tensor is also an output)."""

    def __init__(self, form: str, rot: int = 32) -> None:
        super().__init__()
        self.form, self.rot = form, rot
        self.proj = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):  # noqa: ANN201
        q = self.proj(x).view(x.shape[0], x.shape[1], 2, 32)
        q_rot, q_pass = q[..., : self.rot], q[..., self.rot :]
        x1, x2 = q_rot[..., ::2], q_rot[..., 1::2]
        pair = (x1, -x2) if self.form == "swapped" else (-x2, x1)
        rot = torch.stack(pair, dim=-1).flatten(-2)
        out = torch.cat([q_rot * cos + rot * sin, q_pass], dim=-1).transpose(1, 2)
        return (out, rot) if self.form == "shared" else out


@pytest.mark.parametrize("form,rot,fused", [("gptj", 32, True), ("gptj", 16, True), ("swapped", 32, False), ("shared", 32, False)])
def test_interleaved_rotary_is_fused(form, rot, fused, device):
    gen = torch.Generator().manual_seed(rot + len(form))
    x = torch.randn(2, 5, 32, generator=gen).to(device)
    ang = (torch.rand(5, rot // 2, generator=gen) * 6.0).repeat_interleave(2, -1).to(device)[None, :, None, :]
    model = _InterleavedRope(form, rot).to(device).eval()
    g, xs = _imported(model, (x, ang.cos(), ang.sin()))
    r = fuse_rotary(g)
    rots = _ops(r, "rotary")
    assert len(rots) == int(fused)
    if fused:
        assert rots[0].attrs["interleaved"] and rots[0].attrs.get("rotary_dims") == (rot if rot < 32 else None)
        assert not _ops(r, "neg") and not _ops(r, "cat")
    _close(g, r, xs)


def test_compiled_interleaved_rotary_matches_eager(device):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 7, 32, generator=gen).to(device)
    ang = (torch.rand(7, 8, generator=gen) * 6.0).repeat_interleave(2, -1).to(device)[None, :, None, :]
    model = _InterleavedRope("gptj", 16).to(device).eval()
    compiled = kfuse.compile(model, (x, ang.cos(), ang.sin()))
    rots = [k for k in compiled.report["kernels"] if k["template"] == "rotary"]
    assert len(rots) == 1 and "rotate_every_two" in rots[0]["config"] and "16 of 32 columns" in rots[0]["config"]
    x2 = torch.randn(2, 7, 32, generator=gen).to(device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2, ang.cos(), ang.sin()), model(x2, ang.cos(), ang.sin()), atol=1e-5, rtol=1e-4)
