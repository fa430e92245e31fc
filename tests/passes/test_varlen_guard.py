"""Automatic padding-free mode is applied only where its zeros at padded positions cannot reach the result:
region outputs that are graph outputs or are read outside the region at sequence position 0 only."""

import pytest
import torch
import torch.nn.functional as F

import kfuse
import kfuse.models

B, S, H, NH = 2, 8, 32, 2


class _Enc(torch.nn.Module):
    """q/k/v/o linears -> SDPA with a boolean key-padding mask -> ``pool`` (the audit's repro)."""

    def __init__(self, pool: str) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(H, H) for _ in range(4))
        self.pool = pool

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, S, NH, H // NH).permute(0, 2, 1, 3)

        m = mask[:, None, None, :].bool()
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=m)
        h = self.o(a.permute(0, 2, 1, 3).reshape(B, S, H))
        if self.pool == "mean":  # unmasked mean pooling: reads padded positions
            return h.mean(1)
        if self.pool == "last":  # last-token pooling: reads padded positions of right-padded rows
            return h[:, -1]
        if self.pool == "cls":
            return h[:, 0]
        return h


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, H, generator=gen).to(device)
    mask = torch.ones(B, S, dtype=torch.long, device=device)
    mask[1, 5:] = 0  # row 1 padded from position 5
    return x, mask


def _model(pool: str, device: str) -> _Enc:
    torch.manual_seed(0)
    return _Enc(pool).to(device).eval()


def _templates(compiled) -> list[str]:
    return [k["template"] for k in compiled.report["kernels"]]


def _configs(compiled) -> str:
    return " | ".join(k.get("config", "") for k in compiled.report["kernels"])


@pytest.mark.parametrize("pool", ["mean", "last"])
def test_padded_position_reader_keeps_padded_layout(pool, device):
    m, (x, mask) = _model(pool, device), _inputs(device)
    compiled = kfuse.compile(m, (x, mask))
    assert "varlen_region" not in _templates(compiled)
    notes = _configs(compiled)
    assert "padding-free mode not applied:" in notes and "reads padded positions of" in notes, notes
    with torch.no_grad():
        ref = m(x, mask)
    out = compiled(x, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # padding in other places (the plan is reused): still eager's result
    mask2 = torch.ones_like(mask)
    mask2[0, 2:] = 0
    with torch.no_grad():
        ref2 = m(x, mask2)
    torch.testing.assert_close(compiled(x, mask2), ref2, atol=1e-5, rtol=1e-5)


def test_forced_varlen_still_applied_with_warning_note(device):
    m, (x, mask) = _model("mean", device), _inputs(device)
    compiled = kfuse.compile(m, (x, mask), varlen=True, check=False)
    assert _templates(compiled).count("varlen_region") == 1
    region = next(k for k in compiled.report["kernels"] if k["template"] == "varlen_region")
    assert "padding-free mode forced (varlen=True)" in region["config"] and "reads padded positions of" in region["config"]


def test_region_output_returned_keeps_padding_free(device):
    m, (x, mask) = _model("none", device), _inputs(device)
    compiled = kfuse.compile(m, (x, mask))
    assert _templates(compiled).count("varlen_region") == 1
    assert "not applied" not in _configs(compiled) and "forced" not in _configs(compiled)
    with torch.no_grad():
        ref = m(x, mask)
    out = compiled(x, mask)
    v = mask.bool()
    torch.testing.assert_close(out[v], ref[v], atol=1e-5, rtol=1e-5)
    assert torch.all(out[~v] == 0)  # the documented behaviour of returned hidden states


def test_cls_pooling_keeps_padding_free(device):
    m, (x, mask) = _model("cls", device), _inputs(device)
    compiled = kfuse.compile(m, (x, mask))
    assert _templates(compiled).count("varlen_region") == 1
    assert "not applied" not in _configs(compiled)
    with torch.no_grad():
        ref = m(x, mask)
    torch.testing.assert_close(compiled(x, mask), ref, atol=1e-5, rtol=1e-5)


def test_bert_with_pooler_keeps_padding_free(device):
    m, a, k = kfuse.models.build("bert-tiny", batch=2, seq=16, with_mask=True, avg_len_ratio=0.6, device=device)
    compiled = kfuse.compile(m, a, k)
    assert _templates(compiled).count("varlen_region") == 1
    assert "not applied" not in _configs(compiled)
    assert compiled.report["max_abs_err"] < 1e-4
