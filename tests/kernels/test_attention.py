"""Fused attention kernel vs the float32 reference: every mask kind, odd lengths, packed varlen."""

import dataclasses

import pytest
import torch

from kfuse.kernels import attention as A

TOL = {torch.float32: 2e-4, torch.float16: 2e-2}


def _poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _cu_seqlens(lens):
    """Prefix sums of the sequence lengths, int32 [B+1], as the packed kernels take them."""
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    return cu


def _mask(kind, b, h, sq, sk, device, gen):
    if kind == A.MASK_KEY_PADDING:
        m = (torch.rand(b, sk, generator=gen) > 0.4).long()
        m[:, 0] = 1  # no row with every key masked (SDPA's answer there is NaN)
        return m.to(device)
    if kind == A.MASK_DENSE_BOOL:
        m = torch.rand(b, 1, sq, sk, generator=gen) > 0.4
        m[..., 0] = True
        return m.to(device)
    if kind == A.MASK_DENSE_ADD:
        return torch.randn(1, h, sq, sk, generator=gen).to(device)
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", [A.MASK_NONE, A.MASK_KEY_PADDING, A.MASK_DENSE_BOOL, A.MASK_DENSE_ADD])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_masks(dtype, kind, causal, device):
    gen = torch.Generator().manual_seed(hash((kind, causal)) % 1000)
    b, h, s, d = 2, 2, 7, 64
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(device, dtype) for _ in range(3))
    mask = _mask(kind, b, h, s, s, device, gen)
    out = _poisoned((b, h, s, d), dtype, device)
    A.attention(q, k, v, mask=mask, mask_kind=kind, causal=causal, out=out)
    ref = A.reference(q, k, v, mask=mask, mask_kind=kind, causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("s,d", [(1, 64), (129, 64), (33, 128), (7, 40)])
def test_odd_lengths_and_head_dims(s, d, device):
    gen = torch.Generator().manual_seed(s * d)
    q, k, v = (torch.randn(1, 1, s, d, generator=gen).to(device, torch.float16) for _ in range(3))
    for causal in (False, True):
        out = _poisoned((1, 1, s, d), torch.float16, device)
        assert A.attention(q, k, v, causal=causal, scale=0.3, out=out) is out
        torch.testing.assert_close(out.float(), A.reference(q, k, v, causal=causal, scale=0.3), atol=2e-2, rtol=2e-2)


def test_strided_views_of_merged_qkv(device):
    """Q, K, V read in place from a [B, S, 3*H*D] projection (no copies)."""
    gen = torch.Generator().manual_seed(3)
    b, s, h, d = 2, 9, 2, 64
    qkv = torch.randn(b, s, 3 * h * d, generator=gen).to(device, torch.float16)
    q, k, v = (qkv[..., i * h * d : (i + 1) * h * d].view(b, s, h, d).permute(0, 2, 1, 3) for i in range(3))
    out = torch.full((b, s, h * d), float("nan"), dtype=torch.float16, device=device)
    A.attention(q, k, v, out=out.view(b, s, h, d).permute(0, 2, 1, 3))
    ref = A.reference(q, k, v).permute(0, 2, 1, 3).reshape(b, s, h * d)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_mixed_lengths(causal, device):
    """Empty, length-1, short and full sequences in one packed batch."""
    gen = torch.Generator().manual_seed(11)
    lens = torch.tensor([1, 0, 7, 40, 3])
    cu = _cu_seqlens(lens)
    t, h, d = int(lens.sum()), 2, 64
    qkv = torch.randn(t, 3, h, d, generator=gen).to(device, torch.float16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    out = _poisoned((t, h, d), torch.float16, device)
    A.varlen_attention(q, k, v, cu.to(device), 40, causal=causal, out=out)
    ref = A.varlen_reference(q, k, v, cu, causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_varlen_equals_padded_key_mask(device):
    """Packed varlen attention gives the padded masked attention's values at valid positions; each
    path is also checked against its own oracle (they share the kernel's inner loop)."""
    gen = torch.Generator().manual_seed(5)
    lens = [5, 1, 8]
    b, s, h, d = 3, 8, 2, 32
    x = torch.randn(3, b, h, s, d, generator=gen).to(device, torch.float32)
    mask = torch.stack([torch.arange(s) < n for n in lens]).long().to(device)
    dense = _poisoned((b, h, s, d), torch.float32, device)
    A.attention(x[0], x[1], x[2], mask=mask, mask_kind=A.MASK_KEY_PADDING, out=dense)
    ref = A.reference(x[0], x[1], x[2], mask=mask, mask_kind=A.MASK_KEY_PADDING)
    torch.testing.assert_close(dense, ref, atol=2e-4, rtol=2e-4)
    valid = mask.bool()
    packed = [x[i].permute(0, 2, 1, 3)[valid] for i in range(3)]  # [T, H, D]
    cu = torch.tensor([0, 5, 6, 14], dtype=torch.int32, device=device)
    out = _poisoned(packed[0].shape, torch.float32, device)
    A.varlen_attention(*packed, cu, s, out=out)
    torch.testing.assert_close(out, A.varlen_reference(*packed, cu), atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(out, dense.permute(0, 2, 1, 3)[valid], atol=2e-4, rtol=2e-4)


def test_all_masked_rows_are_zero(device):
    gen = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 1, 4, 16, generator=gen).to(device) for _ in range(3))
    mask = torch.zeros(1, 1, 4, 4, dtype=torch.bool, device=device)
    mask[0, 0, :2] = True
    out = _poisoned((1, 1, 4, 16), torch.float32, device)  # an unwritten row stays NaN, not zero by luck
    A.attention(q, k, v, mask=mask, mask_kind=A.MASK_DENSE_BOOL, out=out)
    assert torch.all(out[0, 0, 2:] == 0)
    ref = A.reference(q, k, v, mask=mask, mask_kind=A.MASK_DENSE_BOOL)
    assert ref[0, 0, :2].abs().max() > 0.1  # the attended rows are not zero: a zeroed output fails
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 1), (8, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_heads_read_their_shared_kv_head(heads, kv_heads, causal, device):
    """GQA: K/V have fewer heads than Q, given as strided views of one packed [B, S, 2*Hkv*D]
    projection; query head h must read kv head h // G (a wrong group order fails: every kv head
    has its own random values)."""
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    b, sq, d = 2, 13, 32
    q = torch.randn(b, heads, sq, d, generator=gen).to(device, torch.float16)
    kv = torch.randn(b, sq, 2, kv_heads, d, generator=gen).to(device, torch.float16)
    k, v = kv[:, :, 0].permute(0, 2, 1, 3), kv[:, :, 1].permute(0, 2, 1, 3)
    out = _poisoned((b, heads, sq, d), torch.float16, device)
    A.attention(q, k, v, causal=causal, out=out)
    g = heads // kv_heads
    ref = A.reference(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), causal=causal)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(A.reference(q, k, v, causal=causal), ref)  # the oracle repeats the same way


def test_clear_errors(device):
    q = torch.randn(1, 1, 4, 16, device=device)
    with pytest.raises(ValueError, match="rank 4"):
        A.attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="key padding mask"):
        A.attention(q, q, q, mask=torch.ones(2, 4, device=device), mask_kind=A.MASK_KEY_PADDING)
    q3 = torch.randn(1, 3, 4, 16, device=device)
    with pytest.raises(ValueError, match="do not match"):  # 3 query heads cannot share 2 kv heads
        A.attention(q3, q3[:, :2], q3[:, :2])
    assert A.config_space(64) and A.config_space(128)


@pytest.mark.parametrize("cfg", A.config_space(64, causal=True), ids=lambda c: c.describe())
def test_every_config_of_the_space(cfg, device):
    """The autotuner may pick any config of the space on the GPU: each must be right."""
    gen = torch.Generator().manual_seed(7)
    b, h, s, d = 1, 2, 77, 64
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(device, torch.float32) for _ in range(3))
    mask = _mask(A.MASK_KEY_PADDING, b, h, s, s, device, gen)
    out = _poisoned((b, h, s, d), torch.float32, device)
    A.attention(q, k, v, mask=mask, mask_kind=A.MASK_KEY_PADDING, causal=True, out=out, config=cfg)
    ref = A.reference(q, k, v, mask=mask, mask_kind=A.MASK_KEY_PADDING, causal=True)
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=TOL[torch.float32])


@pytest.mark.parametrize("cfg", A.config_space(128, causal=True), ids=lambda c: c.describe())
def test_every_config_of_the_head_dim_128_space(cfg, device):
    """Head dim 128 has its own space (three stages where they fit, key tiles of 64 or fewer)."""
    gen = torch.Generator().manual_seed(8)
    b, h, s, d = 1, 2, 45, 128
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(device, torch.float32) for _ in range(3))
    out = _poisoned((b, h, s, d), torch.float32, device)
    A.attention(q, k, v, causal=True, out=out, config=cfg)
    torch.testing.assert_close(out, A.reference(q, k, v, causal=True), atol=TOL[torch.float32], rtol=TOL[torch.float32])


def test_three_stages_wherever_they_fit():
    assert all(c.num_stages == 3 for c in A.config_space(128))
    for c in A.config_space(256):  # the 128-row tiles at head dim 256 fall back to two
        assert ((c.block_m * 256 + c.num_stages * 2 * c.block_n * 256) * 2 <= 228 * 1024) and (c.num_stages == 3 or c.block_m == 128)


@pytest.mark.parametrize("cfg", [A.AttnConfig(16, 16, 4, 1), A.AttnConfig(32, 16, 4, 1), A.AttnConfig(16, 32, 4, 1)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (16, 16), (37, 37), (64, 64), (20, 45), (45, 20)])
def test_unmasked_and_edge_key_tiles_split_at_every_tile_shape(cfg, causal, sq, sk, device):
    """The kernel runs the key tiles wholly inside the sequence (and, causal, wholly left of the
    query tile's first row) without masks, the rest masked: tiles taller, shorter and as tall as the
    key tiles, lengths on and off the tile edges, more and fewer keys than queries."""
    gen = torch.Generator().manual_seed(sq * 100 + sk)
    b, h, d = 2, 3, 32
    q = torch.randn(b, h, sq, d, generator=gen).to(device)
    k, v = (torch.randn(b, h, sk, d, generator=gen).to(device) for _ in range(2))
    out = _poisoned((b, h, sq, d), torch.float32, device)
    A.attention(q, k, v, causal=causal, out=out, config=cfg)
    torch.testing.assert_close(out, A.reference(q, k, v, causal=causal), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("cfg", [A.AttnConfig(16, 16, 4, 1), A.AttnConfig(32, 16, 4, 1)], ids=str)
def test_varlen_causal_split_per_sequence(cfg, device):
    """Packed sequences: the unmasked range is each sequence's own (its length, its rows)."""
    gen = torch.Generator().manual_seed(5)
    lens = torch.tensor([33, 16, 1, 50, 17])
    cu = _cu_seqlens(lens)
    t, h, d = int(lens.sum()), 2, 32
    qkv = torch.randn(t, 3, h, d, generator=gen).to(device)
    out = _poisoned((t, h, d), torch.float32, device)
    A.varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu.to(device), 50, causal=True, out=out, config=cfg)
    torch.testing.assert_close(out, A.varlen_reference(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, causal=True), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("cfg", [A.AttnConfig(16, 16, 4, 1, paired=True), A.AttnConfig(16, 32, 4, 1, paired=True)], ids=str)
@pytest.mark.parametrize("sq", [1, 16, 37, 48, 64])
def test_paired_causal_tiles_cover_every_row_once(cfg, sq, device):
    """Paired causal programs run query tile Q_TILES-1-p and then tile p: an odd tile count leaves
    the middle tile to one program alone, an even one pairs every tile; GQA heads as well. The output
    is poisoned first, so a row no program writes fails."""
    gen = torch.Generator().manual_seed(sq + 3)
    b, h, hk, d = 2, 4, 2, 32
    q = torch.randn(b, h, sq, d, generator=gen).to(device)
    k, v = (torch.randn(b, hk, sq, d, generator=gen).to(device) for _ in range(2))
    out = _poisoned((b, h, sq, d), torch.float32, device)
    A.attention(q, k, v, causal=True, out=out, config=cfg)
    torch.testing.assert_close(out, A.reference(q, k, v, causal=True), atol=2e-4, rtol=2e-4)
    dense = _poisoned((b, h, sq, d), torch.float32, device)  # not causal: the flag is ignored
    A.attention(q, k, v, out=dense, config=cfg)
    torch.testing.assert_close(dense, A.reference(q, k, v), atol=2e-4, rtol=2e-4)


def test_paired_causal_varlen_sequences_shorter_than_the_grid(device):
    """Packed sequences pair tiles of the longest one: in a shorter sequence the long tile of a pair
    may lie past its end (skipped) while its short partner still runs."""
    gen = torch.Generator().manual_seed(9)
    lens = torch.tensor([50, 17, 1, 33])
    cu = _cu_seqlens(lens)
    t, h, d = int(lens.sum()), 2, 32
    qkv = torch.randn(t, 3, h, d, generator=gen).to(device)
    out = _poisoned((t, h, d), torch.float32, device)
    cfg = A.AttnConfig(16, 16, 4, 1, paired=True)
    A.varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu.to(device), 50, causal=True, out=out, config=cfg)
    torch.testing.assert_close(out, A.varlen_reference(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, causal=True), atol=2e-4, rtol=2e-4)


def test_paired_configs_are_timed_only_where_their_grid_fills_the_gpu():
    """Pairing halves the programs: at Llama-1b B1 S512 (32 heads, 8 tiles of 64 rows) the paired grid
    is 128 programs for 132 SMs and is not timed; at S2048, or at B8, it is. Unpaired configs always are."""
    paired64, paired128 = A.AttnConfig(64, 64, 4, 3, paired=True), A.AttnConfig(128, 64, 8, 3, paired=True)
    assert not A.worth_timing(paired64, 512, 32, 132) and not A.worth_timing(paired128, 512, 32, 132)
    assert A.worth_timing(paired64, 2048, 32, 132) and A.worth_timing(paired64, 512, 8 * 32, 132)
    assert A.worth_timing(paired64, 512, 32, 128)  # a smaller GPU: 128 programs fill it
    assert A.worth_timing(A.AttnConfig(64, 64, 4, 3), 1, 1, 132)


def test_paired_configs_only_in_causal_spaces():
    plain, causal = A.config_space(64), A.config_space(64, causal=True)
    assert not any(c.paired for c in plain)
    paired = [c for c in causal if c.paired]
    assert paired and all(c.block_n == 64 and c.block_m >= 64 for c in paired)
    assert {dataclasses.replace(c, paired=False) for c in paired} <= set(plain)
    assert "paired" in paired[0].describe()


@pytest.mark.parametrize("fma_scale", [False, True])
@pytest.mark.parametrize("kind", [A.MASK_NONE, A.MASK_KEY_PADDING, A.MASK_DENSE_ADD])
@pytest.mark.parametrize("scale", [None, 2.5, -0.3])
def test_both_exponent_forms_match_the_oracle(fma_scale, kind, scale, device, monkeypatch):
    """The exponent as one FFMA of the unscaled score (FMA_SCALE) and the scores scaled first: the
    same answer with every mask kind, an additive mask, causal edges, and a scale above 1 or below 0
    (a negative scale reverses the order of the scores, so the launcher scales first there)."""
    monkeypatch.setattr(A, "FMA_SCALE", fma_scale)
    gen = torch.Generator().manual_seed(kind * 7 + 1)
    b, h, s, d = 2, 2, 37, 32
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(device) for _ in range(3))
    mask = _mask(kind, b, h, s, s, device, gen)
    out = _poisoned((b, h, s, d), torch.float32, device)
    A.attention(q, k, v, mask=mask, mask_kind=kind, causal=True, scale=scale, out=out, config=A.AttnConfig(16, 16, 4, 1))
    ref = A.reference(q, k, v, mask=mask, mask_kind=kind, causal=True, scale=scale)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("tiles", [0, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_every_key_tile_form_gives_the_same_answer(tiles, causal, device, monkeypatch):
    """The loop forms the probe compares (``TILES`` 0: every tile masked, 1: split) forced where the
    launcher would pick another; form 2 (one unmasked loop) is what whole dense tiles get above."""
    monkeypatch.setattr(A, "key_tiles", lambda *a: tiles)
    gen = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(2, 2, 48, 32, generator=gen).to(device) for _ in range(3))
    out = _poisoned((2, 2, 48, 32), torch.float32, device)
    A.attention(q, k, v, causal=causal, out=out, config=A.AttnConfig(32, 16, 4, 1))
    torch.testing.assert_close(out, A.reference(q, k, v, causal=causal), atol=2e-4, rtol=2e-4)


def test_whole_dense_key_tiles_take_the_single_loop():
    cfg = A.AttnConfig(64, 64, 4, 2)
    assert A.key_tiles(cfg, A.MASK_NONE, False, False, 128) == 2
    assert A.key_tiles(cfg, A.MASK_NONE, False, False, 130) == 1  # an edge tile
    assert A.key_tiles(cfg, A.MASK_NONE, True, False, 128) == 1  # causal
    assert A.key_tiles(cfg, A.MASK_NONE, False, True, 128) == 1  # packed sequences end anywhere
    assert A.key_tiles(cfg, A.MASK_KEY_PADDING, False, False, 128) == 1


def test_the_tile_pick_is_by_median_over_rotated_rounds():
    """A config with one lucky timing (the one-shot pick's failure) loses to one that is faster in
    most rounds; every config is timed once a round."""
    a, b, c = A.AttnConfig(64, 64, 4, 2), A.AttnConfig(128, 64, 8, 3), A.AttnConfig(64, 128, 4, 2)
    times = {a: iter([5.0, 20.0, 20.0, 20.0, 20.0]), b: iter([12.0, 12.0, 13.0, 12.0, 12.0]), c: iter([15.0] * 5)}
    seen = []

    def time_one(cfg):
        seen.append(cfg)
        return next(times[cfg])

    assert A.pick_fastest([a, b, c], time_one, rounds=5) == b
    assert len(seen) == 15 and all(seen.count(x) == 5 for x in (a, b, c))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_autotuner_picks_a_config_of_the_space(causal, monkeypatch):
    """On the GPU the first launch of a problem times the space (10 calls a graph, rotated rounds) and
    keeps a config of it for that problem key; the answer is right with the pick."""
    monkeypatch.setattr(A, "AUTOTUNE", True)
    monkeypatch.setattr(A, "_TUNED", {})
    gen = torch.Generator().manual_seed(21)
    b, h, s, d = 2, 4, 200, 64
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16) for _ in range(3))
    out = _poisoned((b, h, s, d), torch.float16, "cuda")
    A.attention(q, k, v, causal=causal, out=out)
    (key, cfg), *_ = A.tuned_configs().items()
    assert key == (s, d, A.MASK_NONE, causal, False, b * h, False) and cfg in A.config_space(d, causal)
    torch.testing.assert_close(out.float(), A.reference(q, k, v, causal=causal), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_a_per_batch_mask_is_tuned_apart_from_a_broadcast_one(monkeypatch):
    """Swin-V2's unshifted windows add a bias broadcast over the batch (it stays in L2); its shifted ones a
    mask per window, streamed from memory. The same shapes, two problem keys, each tuned on its own data."""
    monkeypatch.setattr(A, "AUTOTUNE", True)
    monkeypatch.setattr(A, "_TUNED", {})
    gen = torch.Generator().manual_seed(23)
    b, h, s, d = 8, 3, 49, 32
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16) for _ in range(3))
    for mask in (torch.randn(1, h, s, s, generator=gen), torch.randn(b, h, s, s, generator=gen)):
        m = mask.to("cuda", torch.float16)
        out = _poisoned((b, h, s, d), torch.float16, "cuda")
        A.attention(q, k, v, mask=m, mask_kind=A.MASK_DENSE_ADD, out=out)
        torch.testing.assert_close(out.float(), A.reference(q, k, v, mask=m, mask_kind=A.MASK_DENSE_ADD), atol=2e-2, rtol=2e-2)
    assert sorted(key[-1] for key in A.tuned_configs()) == [False, True]


@pytest.mark.gpu
def test_autotuner_never_picks_a_config_whose_output_disagrees():
    """A tile the compiler gets wrong (the b2b miscompile of session 28) must not win the timing: the
    autotuner groups the outputs of the space and times only the largest group. Here every config but
    one writes the right answer; the odd one out writes noise and is also made the fastest."""
    gen = torch.Generator().manual_seed(22)
    b, h, s, d = 1, 2, 96, 64
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16) for _ in range(3))
    ref = A.reference(q, k, v).to(torch.float16)
    space = A.config_space(d)
    liar = space[-1]
    o = torch.empty_like(ref)

    def run(c):
        if c == liar:
            o.copy_(torch.randn_like(ref))  # wrong, and nearly free
        else:
            o.copy_(ref)
            torch.cuda._sleep(20_000)  # right, and slow
        return o

    assert A._measure_best(run, d) != liar


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_two_additive_masks_read_beside_each_other(dtype, device):
    """Swin-V2's shifted windows: a per-head bias broadcast over the windows and a per-window mask broadcast over
    the heads, added in the kernel without a summed [B*nW, H, N, N] tensor; odd sizes, output poisoned."""
    gen = torch.Generator().manual_seed(31)
    b, h, s, d = 6, 3, 49, 32
    q, k, v = (torch.randn(b, h, s, d, generator=gen).to(device, dtype) for _ in range(3))
    bias = (torch.randn(1, h, s, s, generator=gen) * 2).to(device, dtype)
    region = torch.randint(0, 3, (b, 1, s), generator=gen)
    window = torch.where(region[..., :, None] == region[..., None, :], 0.0, -100.0).to(device, dtype)  # (b, 1, s, s)
    out = _poisoned((b, h, s, d), dtype, device)
    A.attention(q, k, v, mask=bias, mask_kind=A.MASK_DENSE_ADD, mask2=window, out=out)
    want = A.reference(q, k, v, mask=bias, mask_kind=A.MASK_DENSE_ADD, mask2=window)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    summed = A.reference(q, k, v, mask=(bias.float() + window.float()), mask_kind=A.MASK_DENSE_ADD)
    torch.testing.assert_close(want, summed)
    with pytest.raises(ValueError, match="mask2 is a second additive mask"):
        A.attention(q, k, v, mask=bias > 0, mask_kind=A.MASK_DENSE_BOOL, mask2=window)
