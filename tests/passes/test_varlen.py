"""Padding-free mode: pack/unpack, the varlen region on BERT/GPT-2, outputs equal PyTorch at valid positions."""

import pytest
import torch

import kfuse
import kfuse.models
from kfuse.ir.graph import TensorType
from kfuse.runtime.varlen import pack, token_index, unpack


def test_pack_unpack_round_trip(device):
    gen = torch.Generator().manual_seed(0)
    b, s, h = 3, 6, 5
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0]], device=device)
    x = torch.randn(b, s, h, generator=gen).to(device)
    idx, cu, n = token_index(mask)
    assert n == 12 and cu.tolist() == [0, 3, 9, 12]
    packed = pack(x, idx, b, s, flat=False)
    assert packed.shape == (12, h)
    back = unpack(packed, idx, TensorType((b, s, h), x.dtype), flat=False, n_valid=n)
    valid = mask.bool()
    assert torch.equal(back[valid], x[valid]) and torch.all(back[~valid] == 0)
    # a batch-broadcast operand ([1, S, H], e.g. position embeddings) is gathered through the broadcast
    pos = torch.randn(1, s, h, generator=gen).to(device)
    torch.testing.assert_close(pack(pos, idx, b, s, flat=False), pos.expand(b, s, h)[valid])


def _check_valid(name, batch, seq, device):
    m, a, k = kfuse.models.build(name, batch=batch, seq=seq, with_mask=True, avg_len_ratio=0.6, device=device)
    compiled = kfuse.compile(m, a, k)
    assert [x["template"] for x in compiled.report["kernels"]].count("varlen_region") == 1
    valid = k["attention_mask"].bool()
    # a second call with other lengths reuses the compiled plan (same shapes)
    mask2 = torch.zeros_like(k["attention_mask"])
    for i, n in enumerate(torch.arange(batch) % seq + 1):
        mask2[i, :n] = 1
    for mask in (k["attention_mask"], mask2):
        with torch.no_grad():
            ref = m(*a, attention_mask=mask)[0]
        out = compiled(*a, attention_mask=mask)[0]
        v = mask.bool()
        torch.testing.assert_close(out[v], ref[v], atol=1e-4, rtol=1e-4)
        assert torch.all(out[~v] == 0)
    assert compiled.report["max_abs_err"] < 1e-4 and valid.any()
    return compiled


def test_bert_tiny_padding_free(device):
    compiled = _check_valid("bert-tiny", 3, 9, device)
    region = next(k for k in compiled.report["kernels"] if k["template"] == "varlen_region")
    assert "varlen_attention" in region["ops"] and "gemm_epilogue" in region["ops"]


def test_gpt2_tiny_padding_free_causal(device):
    _check_valid("gpt2-tiny", 2, 7, device)


@pytest.mark.parametrize("varlen", [False])
def test_varlen_off_keeps_dense_padding_mask(varlen, device, monkeypatch):
    # kfuse's attention kernel on a GPU too, where the lowering would time it against SDPA and may keep
    # SDPA (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    m, a, k = kfuse.models.build("bert-tiny", batch=2, seq=5, with_mask=True, device=device)
    compiled = kfuse.compile(m, a, k, varlen=varlen)
    templates = [x["template"] for x in compiled.report["kernels"]]
    assert "varlen_region" not in templates and templates.count("fused_attention") == 2
    assert compiled.report["max_abs_err"] < 1e-4
