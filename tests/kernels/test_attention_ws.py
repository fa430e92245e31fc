"""The warp-specialised Gluon attention (an experiment): its TMA addressing on the CPU, its sm_90
compile offline (wgmma, TMA, no spills), and, on a GPU, its answers against the oracle."""

import pytest
import torch
from cubin_facts import run_offline_script

from kfuse.kernels import attention as A
from kfuse.kernels import attention_ws as W


def _layouts(b, h, s, d):
    """The [B, H, S, D] views kfuse's plans pass: contiguous heads, heads as column blocks of a
    [B, S, H, D] tensor, and q / k / v slices of one merged [B, S, 3, H, D] projection output."""
    gen = torch.Generator().manual_seed(b * 100 + h * 10 + s)
    yield "bhsd", torch.randn(b, h, s, d, generator=gen)
    yield "bshd", torch.randn(b, s, h, d, generator=gen).permute(0, 2, 1, 3)
    qkv = torch.randn(b, s, 3, h, d, generator=gen)
    for i, name in enumerate("qkv"):
        yield f"merged_{name}", qkv[:, :, i].permute(0, 2, 1, 3)


@pytest.mark.parametrize("b,h,s,d", [(1, 1, 128, 64), (2, 3, 256, 64), (3, 2, 128, 128)])
def test_tma_view_addresses_every_head_row(b, h, s, d):
    """Row b * rb + h * rh + s, columns h * ch .. + d of the 2-D view are element [b, h, s, :] of the
    tensor, for every head of every batch: the kernel's only way of finding its rows."""
    for name, t in _layouts(b, h, s, d):
        tv = W.tma_view(t)
        assert tv is not None, name
        assert tv.view.stride(1) == 1 and tv.view.data_ptr() == t.data_ptr(), name
        for bi in range(b):
            for hi in range(h):
                row, col = bi * tv.rb + hi * tv.rh, hi * tv.ch
                torch.testing.assert_close(tv.view[row : row + s, col : col + d], t[bi, hi], rtol=0, atol=0, msg=name)


def test_tma_view_refuses_what_tma_cannot_address():
    t = torch.randn(2, 3, 128, 64)
    assert W.tma_view(t.transpose(2, 3)) is None  # head dim not contiguous
    assert W.tma_view(torch.randn(2, 3, 128, 66)[..., :64]) is None  # fp32 rows 264 bytes apart: not a multiple of 16
    interleaved = torch.randn(2, 128, 64, 3).permute(0, 3, 1, 2)  # heads innermost: the head dim has stride 3
    assert W.tma_view(interleaved) is None


def test_eligible_says_why_not():
    cfg = W.WsAttnConfig(64, 128, 2)
    q = torch.randn(2, 4, 256, 64, dtype=torch.float16)
    assert W.eligible(q, q, q, False, cfg) is None
    assert "fp16/bf16" in W.eligible(q.float(), q.float(), q.float(), False, cfg)
    assert "head dim" in W.eligible(q[..., :32], q[..., :32], q[..., :32], False, cfg)
    short = torch.randn(2, 4, 200, 64, dtype=torch.float16)
    assert "multiple of the tiles" in W.eligible(short, short, short, False, cfg)
    assert "masks" in W.eligible(q, q, q, False, cfg, has_mask=True)
    assert "as many keys" in W.eligible(q, q[:, :, :128], q[:, :, :128], True, cfg)
    assert all(c.smem_bytes(128) <= 232448 for c in W.config_space(128)) and W.config_space(64)
    pp = W.WsAttnConfig(64, 128, 2, pingpong=True)
    assert W.eligible(q, q, q, False, pp) is None
    assert "dense only" in W.eligible(q, q, q, True, pp)
    assert "pick one" in W.eligible(q, q, q, False, W.WsAttnConfig(64, 128, 2, True, True))
    assert any(c.pingpong for c in W.config_space(64)) and not any(c.pingpong for c in W.config_space(64, causal=True))
    three = W.WsAttnConfig(64, 128, 2, consumers=3)
    assert W.eligible(q, q, q, True, three) is None  # 256 query rows: a program of 192 and one partly past the end
    assert "plain form only" in W.eligible(q, q, q, False, W.WsAttnConfig(64, 128, 2, True, consumers=3))
    assert "2 or 3" in W.eligible(q, q, q, False, W.WsAttnConfig(64, 128, 2, consumers=4))
    odd = torch.randn(2, 4, 224, 64, dtype=torch.float16)  # 224 rows: 3.5 consumer tiles
    assert "multiple of the tiles" in W.eligible(odd, q, q, False, three)
    assert any(c.consumers == 3 for c in W.config_space(64)) and not any(c.consumers == 3 for c in W.config_space(128))
    assert all(c.smem_bytes(64) <= 232448 for c in W.config_space(64, causal=True))


def test_register_split_fits_the_sm():
    """Every consumer count's setmaxnreg split fits the 65,536 registers of an SM (the loader's warp
    takes a warpgroup's worth): a split that does not would leave setmaxnreg waiting forever."""
    for n in (2, 3):
        assert 4 * 32 * (n * W.CONSUMER_REGS[n] + W.LOADER_REGS[n]) <= 65536
        assert W.CONSUMER_REGS[n] % 8 == 0 and W.LOADER_REGS[n] % 8 == 0 and W.LOADER_REGS[n] >= 24


_OFFLINE = r"""
import json, sys
import torch
from cubin_facts import sass_facts
from kfuse.kernels import attention_ws as W
out = []
for b, h, hk, s, d, causal, layout, bn, stages, pipelined, pingpong, consumers in json.loads(sys.argv[1]):
    cfg = W.WsAttnConfig(64, bn, stages, pipelined, pingpong, consumers)
    ck = W.compile_offline(b, h, hk, s, d, causal, cfg, layout=layout)
    f = sass_facts(ck.asm["cubin"])
    tma = ck.asm["ptx"].count("cp.async.bulk.tensor.2d")
    out.append({"facts": f, "shared": ck.metadata.shared, "predicted": cfg.smem_bytes(d), "tma": tma})
print(json.dumps(out))
"""


def test_kernel_compiles_for_sm90_with_wgmma_tma_and_no_spills():
    """Dense and causal, head dims 64 and 128, contiguous and column-block heads, GQA, plain,
    pipelined (two score tiles live: the case that could spill), ping-pong, and three consumers at
    160 registers: each compiles offline to HGMMA with
    2-D TMA loads (two Q tiles, K and V) and no local memory, in the shared memory the config predicts."""
    cases = [
        (2, 4, 4, 256, 64, False, "bhsd", 128, 2, False, False, 2),
        (2, 4, 4, 256, 64, True, "bhsd", 64, 3, False, False, 2),
        (2, 8, 2, 512, 128, True, "bshd", 128, 2, False, False, 2),
        (2, 4, 2, 256, 128, False, "bshd", 64, 3, False, False, 2),
        (2, 4, 4, 256, 64, False, "bhsd", 128, 2, True, False, 2),
        (2, 8, 2, 512, 128, True, "bshd", 128, 2, True, False, 2),
        (2, 4, 4, 256, 64, False, "bhsd", 128, 2, False, True, 2),
        (2, 8, 2, 512, 128, False, "bshd", 128, 3, False, True, 2),
        (2, 8, 2, 512, 64, False, "bhsd", 128, 3, False, False, 3),
        (2, 8, 2, 512, 64, True, "bshd", 64, 3, False, False, 3),
    ]
    got = run_offline_script(_OFFLINE, cases, timeout=600)
    for case, g in zip(cases, got, strict=True):
        f = g["facts"]
        assert f["HGMMA"] > 0 and f["STL"] == 0 and f["LDL"] == 0 and f["STACK"] == 0, (case, g)
        assert g["tma"] >= 4, (case, g)
        assert 0 <= g["predicted"] - g["shared"] <= 1024, (case, g)


def _check_both_layouts(cfg, causal, b, h, hk, s, d, seed):
    """Contiguous heads, and heads as column blocks of merged projection outputs (Q from a
    [B, S, H, D] tensor, K and V slices of one [B, S, 2, Hkv, D]), each against the oracle with the
    output poisoned first."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dense = [torch.randn(b, n, s, d, generator=gen, device="cuda", dtype=torch.float16) for n in (h, hk, hk)]
    kv = torch.randn(b, s, 2, hk, d, generator=gen, device="cuda", dtype=torch.float16)
    merged = [torch.randn(b, s, h, d, generator=gen, device="cuda", dtype=torch.float16).permute(0, 2, 1, 3)]
    merged += [kv[:, :, 0].permute(0, 2, 1, 3), kv[:, :, 1].permute(0, 2, 1, 3)]
    for q, k, v in (dense, merged):
        assert W.eligible(q, k, v, causal, cfg) is None
        out = torch.full((b, h, s, d), float("nan"), dtype=torch.float16, device="cuda")
        W.attention_ws(q, k, v, causal=causal, out=out, config=cfg)
        torch.testing.assert_close(out.float(), A.reference(q, k, v, causal=causal), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "cfg", [W.WsAttnConfig(64, 128, 2), W.WsAttnConfig(64, 64, 3), W.WsAttnConfig(64, 128, 2, True)], ids=lambda c: c.describe()
)
@pytest.mark.parametrize("h,hk,d", [(4, 4, 64), (8, 2, 128)])
def test_gpu_answers_match_the_oracle(causal, cfg, h, hk, d):
    """Two consumers, plain and pipelined, dense and causal, GQA, head dims 64 and 128, in both
    layouts (``_check_both_layouts``)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised attention needs sm_90")
    _check_both_layouts(cfg, causal, 2, h, hk, 384, d, seed=h * 10 + d)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg", [W.WsAttnConfig(64, 128, 2, pingpong=True), W.WsAttnConfig(64, 64, 3, pingpong=True)], ids=lambda c: c.describe()
)
@pytest.mark.parametrize("s", [128, 384, 1024])
def test_gpu_pingpong_matches_the_oracle(cfg, s):
    """The ping-pong consumers (dense): one key tile (no turns), a few, and enough to wrap the ring
    many times; GQA; output poisoned first. A wrong turn phase hangs or races, a wrong rescale order
    gives wrong rows."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised attention needs sm_90")
    if s % cfg.block_n:
        pytest.skip("sequence not a multiple of the key tile")
    gen = torch.Generator(device="cuda").manual_seed(s)
    q = torch.randn(2, 8, s, 64, generator=gen, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 2, s, 64, generator=gen, device="cuda", dtype=torch.float16) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    W.attention_ws(q, k, v, out=out, config=cfg)
    torch.testing.assert_close(out.float(), A.reference(q, k, v), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "cfg", [W.WsAttnConfig(64, 128, 2, consumers=3), W.WsAttnConfig(64, 64, 3, consumers=3)], ids=lambda c: c.describe()
)
@pytest.mark.parametrize("s", [128, 384, 448])
def test_gpu_three_consumers_match_the_oracle(causal, cfg, s):
    """Three consumer warpgroups of 64 rows: a program of 192 rows, the last one partly past the
    sequence (128 and 448 rows), whose rows beyond it must not be stored (poisoned output: a stray
    store shows as a NaN or wrong row in the next head); GQA, contiguous and merged layouts."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised attention needs sm_90")
    if s % cfg.block_n:
        pytest.skip("sequence not a multiple of the key tile")
    _check_both_layouts(cfg, causal, 2, 8, 2, s, 64, seed=s + causal)


@pytest.mark.gpu
def test_gpu_more_keys_than_queries():
    """Dense, 256 queries against 512 keys: the key loop runs over the keys, not the queries."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised attention needs sm_90")
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(2, 4, 256, 64, generator=gen, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(2, 4, 512, 64, generator=gen, device="cuda", dtype=torch.float16) for _ in range(2))
    for cfg in (W.WsAttnConfig(64, 128, 2), W.WsAttnConfig(64, 128, 2, consumers=3), W.WsAttnConfig(64, 128, 2, pingpong=True)):
        out = torch.full_like(q, float("nan"))
        W.attention_ws(q, k, v, out=out, config=cfg)
        torch.testing.assert_close(out.float(), A.reference(q, k, v), atol=2e-2, rtol=2e-2)
