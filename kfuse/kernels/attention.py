"""Fused multi-head attention (flash-style online softmax) in one Triton template.

One program computes a BLOCK_M tile of query rows for one (batch, head) (causal ``paired`` configs:
a tile and its mirror, so every program sees as many key tiles); it streams key/value tiles of
BLOCK_N rows, keeps the running row max and row sum in registers and never writes the score matrix
to memory. The same kernel covers:

- dense batches ``[B, H, S, D]`` given as strided views (so a ``[B, S, H*D]`` projection output,
  or a slice of a merged QKV output, is read in place: no transposes, no copies);
- **packed variable-length** batches: tokens ``[T, H, D]`` with ``cu_seqlens`` (prefix sums of
  the lengths, int32 ``[B+1]``); no padded token is ever loaded or computed;
- masks: none, causal (top-left aligned, as SDPA's ``is_causal``), key padding (``[B, Sk]``,
  nonzero = attend), a dense boolean mask or a dense additive float mask (``[B|1, H|1, Sq, Sk]``
  via strides, broadcast dims have stride 0).

Rows whose keys are all masked produce zeros (SDPA's math path gives NaN there).
Tile parameters are template parameters; on the GPU a small config list is autotuned per
(sequence length, head dim, mask kind) key; ``reference`` is the PyTorch oracle.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from kfuse.kernels import pdl
from kfuse.kernels.codegen import interpreting
from kfuse.kernels.pdl import pdl_start
from kfuse.runtime import cuda_fault

MASK_NONE, MASK_KEY_PADDING, MASK_DENSE_BOOL, MASK_DENSE_ADD = 0, 1, 2, 3
_LOG2E = 1.4426950408889634
# the exponent as one FFMA of the unscaled score (session 24); False: the scores scaled first (the A/B probe's other side)
FMA_SCALE = True


@triton.jit
def _attn_block(
    acc, l_i, m_i, q, k_base, v_base, M, start_n, offs_m, offs_n, offs_d, mask_d, row_ok, k_start, k_len, b, h,
    stride_ks, stride_vs, stride_mb, stride_mh, stride_mq, stride_mk, scale_log2, M2b, stride_m2q, stride_m2k,
    MASKED: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, FMA_SCALE: tl.constexpr,
    MASK2: tl.constexpr,
):  # fmt: skip
    # one K/V tile of the online softmax. MASKED False: every key of the tile exists and every row may
    # see it (no causal edge, no mask input), so no compares, selects or masked loads are issued.
    # FMA_SCALE (scale > 0): the scores stay unscaled, the row max is scaled once a row and each
    # exponent is one FFMA, qk * scale - max, instead of an FMUL of every score and an FADD
    cols = start_n + offs_n
    if MASKED:
        col_ok = cols < k_len
        kt = tl.load(k_base + (k_start + cols)[None, :] * stride_ks + offs_d[:, None], mask=col_ok[None, :] & mask_d[:, None], other=0.0)
    else:
        kt = tl.load(k_base + (k_start + cols)[None, :] * stride_ks + offs_d[:, None], mask=mask_d[:, None], other=0.0)
    qk = tl.dot(q, kt, input_precision=PRECISION)
    if not FMA_SCALE:
        qk = qk * scale_log2
    if MASKED:
        allowed = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= offs_m[:, None])
        if MASK_KIND == 1:
            km = tl.load(M + b * stride_mb + cols * stride_mk, mask=col_ok, other=0)
            allowed = allowed & (km != 0)[None, :]
        if MASK_KIND == 2:
            mp = M + b * stride_mb + h * stride_mh + offs_m[:, None] * stride_mq + cols[None, :] * stride_mk
            mm = tl.load(mp, mask=row_ok[:, None] & col_ok[None, :], other=0)
            allowed = allowed & (mm != 0)
        if MASK_KIND == 3:
            mp = M + b * stride_mb + h * stride_mh + offs_m[:, None] * stride_mq + cols[None, :] * stride_mk
            madd = tl.load(mp, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
            if MASK2:  # a second additive mask (M2b: this (batch, head)'s base), read beside the first, never summed in memory
                mp2 = M2b + offs_m[:, None] * stride_m2q + cols[None, :] * stride_m2k
                madd += tl.load(mp2, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
            if FMA_SCALE:
                qk = qk + madd * (1.4426950408889634 / scale_log2)
            else:
                qk = qk + madd * 1.4426950408889634
        qk = tl.where(allowed, qk, -1.0e30)
    if FMA_SCALE:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * scale_log2)
        p = tl.exp2(qk * scale_log2 - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
    if MASKED:
        p = tl.where(allowed, p, 0.0)
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if MASKED:
        v = tl.load(v_base + (k_start + cols)[:, None] * stride_vs + offs_d[None, :], mask=col_ok[:, None] & mask_d[None, :], other=0.0)
    else:
        v = tl.load(v_base + (k_start + cols)[:, None] * stride_vs + offs_d[None, :], mask=mask_d[None, :], other=0.0)
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def _attn_rows(
    Q, Out, M, k_base, v_base, pid_m, b, h, q_start, q_len, k_start, k_len, scale_log2,
    stride_qb, stride_qh, stride_qs, stride_ks, stride_vs, stride_ob, stride_oh, stride_os,
    stride_mb, stride_mh, stride_mq, stride_mk, D, M2b, stride_m2q, stride_m2k,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, TILES: tl.constexpr, FMA_SCALE: tl.constexpr,
    MASK2: tl.constexpr,
):  # fmt: skip
    # one BLOCK_M tile of query rows of one (batch, head), every key tile it may see
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    row_ok = offs_m < q_len
    q_ptrs = Q + b * stride_qb + h * stride_qh + (q_start + offs_m)[:, None] * stride_qs + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & mask_d[None, :], other=0.0)
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    hi = k_len
    if CAUSAL:
        hi = tl.minimum(k_len, (pid_m + 1) * BLOCK_M)
    # key tiles wholly inside the sequence and, with CAUSAL, wholly left of this tile's first row
    # run unmasked (rows past the sequence's end compute garbage that is never stored); the rest masked
    full = 0
    if TILES == 2:
        full = hi
    elif TILES == 1 and MASK_KIND == 0:
        full = (k_len // BLOCK_N) * BLOCK_N
        if CAUSAL:
            full = tl.minimum(full, ((pid_m * BLOCK_M + 1) // BLOCK_N) * BLOCK_N)
    for start_n in range(0, full, BLOCK_N):
        acc, l_i, m_i = _attn_block(
            acc, l_i, m_i, q, k_base, v_base, M, start_n, offs_m, offs_n, offs_d, mask_d, row_ok, k_start, k_len, b, h,
            stride_ks, stride_vs, stride_mb, stride_mh, stride_mq, stride_mk, scale_log2, M2b, stride_m2q, stride_m2k,
            False, MASK_KIND, CAUSAL, PRECISION, FMA_SCALE, MASK2,
        )  # fmt: skip
    if TILES < 2:
        for start_n in range(full, hi, BLOCK_N):
            acc, l_i, m_i = _attn_block(
                acc, l_i, m_i, q, k_base, v_base, M, start_n, offs_m, offs_n, offs_d, mask_d, row_ok, k_start, k_len, b, h,
                stride_ks, stride_vs, stride_mb, stride_mh, stride_mq, stride_mk, scale_log2, M2b, stride_m2q, stride_m2k,
                True, MASK_KIND, CAUSAL, PRECISION, FMA_SCALE, MASK2,
            )  # fmt: skip
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_ptrs = Out + b * stride_ob + h * stride_oh + (q_start + offs_m)[:, None] * stride_os + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & mask_d[None, :])


@triton.jit
def _attn_fwd(
    Q, K, V, Out, M, CU, M2,
    scale_log2,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
    stride_mb, stride_mh, stride_mq, stride_mk,
    stride_m2b, stride_m2h, stride_m2q, stride_m2k,
    H, SQ, SK, D, KV_GROUP, Q_TILES,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, TILES: tl.constexpr,
    PAIRED: tl.constexpr, FMA_SCALE: tl.constexpr, PDL: tl.constexpr, MASK2: tl.constexpr,
):  # fmt: skip
    # TILES (``key_tiles``): 2 every key tile is whole and unmasked (one loop), 1 the interior tiles
    # unmasked and the edge ones masked (two loops), 0 every tile masked (the kernel before session 23).
    # PAIRED (causal only): program p runs query tile Q_TILES-1-p, then tile p, so every program sees
    # Q_TILES+1 key tiles instead of 1..Q_TILES (the grid's first dimension is half the tiles)
    pdl_start(PDL)
    pid_m = tl.program_id(0)
    if CAUSAL and TILES > 0 and not PAIRED:  # the longest rows (most key tiles) first: the last wave is the short ones
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    if VARLEN:
        q_start = tl.load(CU + b)
        q_len = tl.load(CU + b + 1) - q_start
        k_start = q_start
        k_len = q_len
    else:
        q_start = 0
        k_start = 0
        q_len = SQ
        k_len = SK
    # grouped-query attention: KV_GROUP query heads share one key/value head
    kv_h = h // KV_GROUP
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    m2_base = M2 + b * stride_m2b + h * stride_m2h
    first = pid_m
    if PAIRED:
        first = Q_TILES - 1 - pid_m
    # PAIRED: the long tile, then its mirror pid_m unless that is the same tile. The grid is sized for
    # the longest sequence: tiles past this sequence's end do nothing
    for part in tl.static_range(1 + PAIRED):
        tile = first if part == 0 else pid_m
        runs = tile * BLOCK_M < q_len
        if part == 1:
            runs = runs & (pid_m < first)
        if runs:
            _attn_rows(
                Q, Out, M, k_base, v_base, tile, b, h, q_start, q_len, k_start, k_len, scale_log2,
                stride_qb, stride_qh, stride_qs, stride_ks, stride_vs, stride_ob, stride_oh, stride_os,
                stride_mb, stride_mh, stride_mq, stride_mk, D, m2_base, stride_m2q, stride_m2k,
                BLOCK_M, BLOCK_N, BLOCK_D, MASK_KIND, CAUSAL, PRECISION, TILES, FMA_SCALE, MASK2,
            )  # fmt: skip


@dataclass(frozen=True)
class AttnConfig:
    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    # causal only: each program runs a long query tile and its mirror short one (equal work a program)
    paired: bool = False

    def describe(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}" + (" paired" if self.paired else "")


def config_space(head_dim: int, causal: bool = False) -> list[AttnConfig]:
    """Candidate tiles. Hard rule: the Q tile plus ``stages`` K and V tiles (fp16) must fit in
    the 228 KB of shared memory an H100/H200 SM offers; BLOCK_N shrinks as the head dim grows.
    Three stages wherever they fit: at head dim 128 the 64 x 64 tile ran 41.9 us with three and
    48.9 with two (B8 H12 S512; causal B4 S1024 109.7 against 119.3, session 24's space probe).
    Causal problems also get the paired form of the 64- and 128-row tiles with 64-key tiles: one
    program per mirror pair of query tiles, so no program is short (a 64-row tile at S=512 sees 1 to
    8 key tiles unpaired, 9 paired) and half as many programs start and stop."""
    d = max(16, triton.next_power_of_2(head_dim))

    def fits(bm: int, n: int, stages: int) -> bool:
        return (bm * d + stages * 2 * n * d) * 2 <= 228 * 1024

    out = []
    for bm in (64, 128):
        for n in (32, 64, 128):
            stages = 3 if fits(bm, n, 3) else 2
            if not fits(bm, n, stages) or (d > 64 and n > 64):
                continue
            for w in (4, 8):
                out.append(AttnConfig(bm, n, w, stages))
    # short sequences (BERT at S=128: one or two K/V tiles per program) are latency-bound: more,
    # smaller programs and a shallow pipeline keep more SMs busy (flash SDPA: 0.044 ms at B32 H12
    # S128 D64 against 0.100 ms for the tiles above; to be re-measured)
    if d <= 64:
        out += [AttnConfig(32, 64, 4, 2), AttnConfig(32, 128, 4, 2), AttnConfig(64, 128, 4, 2)]
    if causal:
        out += [replace(c, paired=True) for c in out if c.block_n == 64 and c.block_m >= 64]
    return out


def default_config(max_seq: int, batch_heads: int, head_dim: int) -> AttnConfig:
    """Heuristic tile when nothing was tuned: small grids get short query tiles (more programs)."""
    if interpreting():
        return AttnConfig(16, 16, 4, 1)
    bm = 128 if triton.cdiv(max_seq, 128) * batch_heads >= 132 * 2 else 64
    bn = 64 if head_dim <= 64 else 32
    return AttnConfig(bm, bn, 4 if bm == 64 else 8, 3 if head_dim <= 64 else 2)


_TUNED: dict[tuple, AttnConfig] = {}


def key_tiles(cfg: AttnConfig, mask_kind: int, causal: bool, varlen: bool, sk: int) -> int:
    """How the kernel runs its key tiles (``TILES``): 2 when every tile is whole and nothing masks it
    (dense, no mask, not causal, the keys a multiple of BLOCK_N: one loop without the edge loop's
    code), else 1 (interior tiles unmasked, edge tiles masked)."""
    return 2 if mask_kind == MASK_NONE and not causal and not varlen and sk % cfg.block_n == 0 else 1


def dot_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, what: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise ValueError(f"{what}: {name} must have rank {rank}, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{what}: {name} must be contiguous in the head dim (stride {t.stride(-1)})")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"{what}: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] > 256:
        raise ValueError(f"{what}: head dim {q.shape[-1]} > 256 is not supported")


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    strides: tuple[tuple[int, int, int], ...],
    mask: torch.Tensor | None,
    mask_strides: tuple[int, int, int, int],
    mask_kind: int,
    cu: torch.Tensor | None,
    batch: int,
    heads: int,
    sq: int,
    sk: int,
    scale: float,
    causal: bool,
    config: AttnConfig | None,
    kv_group: int = 1,
    tiles: int | None = None,
    mask2: MaskArgs = (None, (0, 0, 0, 0)),
) -> None:
    d = q.shape[-1]
    m2, m2_strides = mask2
    streamed = (
        mask_kind in (MASK_DENSE_BOOL, MASK_DENSE_ADD) and batch > 1 and (mask_strides[0] != 0 or (m2 is not None and m2_strides[0] != 0))
    )
    key = problem_key(sq, d, mask_kind, causal, cu is not None, batch * heads, streamed)
    cfg = config or _TUNED.get(key)
    if cfg is None and AUTOTUNE and q.is_cuda and not interpreting() and not torch.cuda.is_current_stream_capturing():
        # first launch of this problem on the GPU: a warm-up run, before any CUDA graph capture
        args = (q, k, v, o, strides, mask, mask_strides, mask_kind, cu, batch, heads, sq, sk, scale, causal)

        def run(c: AttnConfig) -> torch.Tensor:
            _launch(*args, c, kv_group, mask2=mask2)
            return o

        cfg = _TUNED[key] = _measure_best(run, d, causal, max_seq=sq, batch_heads=batch * heads)
    cfg = cfg or default_config(sq, batch * heads, d)
    q_tiles = triton.cdiv(max(sq, 1), cfg.block_m)
    paired = cfg.paired and causal
    grid = (triton.cdiv(q_tiles, 2) if paired else q_tiles, batch * heads)
    dummy = o if mask is None else mask
    cu_t = cu if cu is not None else o
    (sqb, sqh, sqs), (skb, skh, sks), (svb, svh, svs), (sob, soh, sos) = strides
    _attn_fwd[grid](
        q, k, v, o, dummy, cu_t, m2 if m2 is not None else dummy,
        scale * _LOG2E,
        sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
        *mask_strides,
        *m2_strides,
        heads, sq, sk, d, kv_group, q_tiles,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
        VARLEN=cu is not None, MASK_KIND=mask_kind, CAUSAL=bool(causal), PRECISION=dot_precision(q.dtype),
        TILES=key_tiles(cfg, mask_kind, causal, cu is not None, sk) if tiles is None else tiles, PAIRED=paired,
        FMA_SCALE=FMA_SCALE and scale > 0, MASK2=m2 is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch_kwargs(),
    )  # fmt: skip


MaskArgs = tuple[torch.Tensor | None, tuple[int, int, int, int]]


def _mask_args(mask: torch.Tensor | None, kind: int, b: int, h: int, sq: int, sk: int) -> MaskArgs:
    if mask is None or kind == MASK_NONE:
        return None, (0, 0, 0, 0)
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # same bytes; Triton loads uint8 reliably
    if kind == MASK_KEY_PADDING:
        if mask.dim() != 2 or mask.shape[1] != sk or mask.shape[0] not in (1, b):
            raise ValueError(f"attention: key padding mask must be [B, Sk] = [{b}, {sk}], got {tuple(mask.shape)}")
        return mask, (mask.stride(0) if mask.shape[0] > 1 else 0, 0, 0, mask.stride(1))
    m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)) if mask.dim() < 4 else mask
    try:
        m4 = m4.expand(b, h, sq, sk)
    except RuntimeError:
        raise ValueError(f"attention: mask of shape {tuple(mask.shape)} does not broadcast to [{b}, {h}, {sq}, {sk}]") from None
    return m4, tuple(m4.stride())  # type: ignore[return-value]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    mask_kind: int = MASK_NONE,
    causal: bool = False,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    config: AttnConfig | None = None,
    mask2: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense attention on ``[B, H, S, D]`` tensors (any strides with a contiguous head dim).

    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention, ``[B, H / G, Sk, D]``):
    query head ``h`` reads key/value head ``h // G``, with no copy of K and V per group.
    ``mask_kind``: MASK_KEY_PADDING with ``mask`` ``[B, Sk]`` (nonzero = attend), MASK_DENSE_BOOL
    (True = attend) or MASK_DENSE_ADD (added to the scores) with a mask broadcastable to
    ``[B, H, Sq, Sk]``. ``mask2``: a second additive mask, broadcastable the same way, added beside ``mask``
    (MASK_DENSE_ADD only): Swin-V2's per-head relative bias and per-window shift mask are never summed into a
    ``[B*nW, H, N, N]`` tensor. Returns ``[B, H, Sq, D]`` (or writes ``out``, any strides)."""
    _check_qkv(q, k, v, 4, "attention")
    b, h, sq, d = q.shape
    sk, hk = k.shape[2], k.shape[1]
    if k.shape[0] != b or hk == 0 or h % hk or v.shape[:3] != k.shape[:3] or k.shape[3] != d or v.shape[3] != d:
        raise ValueError(f"attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = out if out is not None else torch.empty((b, h, sq, d), dtype=q.dtype, device=q.device)
    m, ms = _mask_args(mask, mask_kind, b, h, sq, sk)
    if mask2 is not None and (mask_kind != MASK_DENSE_ADD or m is None or mask2.dtype == torch.bool):
        raise ValueError("attention: mask2 is a second additive mask beside an additive mask (MASK_DENSE_ADD)")
    m2 = _mask_args(mask2, MASK_DENSE_ADD, b, h, sq, sk) if mask2 is not None else (None, (0, 0, 0, 0))
    if sq == 0 or b * h == 0:
        return o
    strides = tuple((t.stride(0), t.stride(1), t.stride(2)) for t in (q, k, v, o))
    kind = mask_kind if m is not None else MASK_NONE
    _launch(q, k, v, o, strides, m, ms, kind, None, b, h, sq, sk, scale, causal, config, h // hk, mask2=m2)  # type: ignore[arg-type]
    return o


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    causal: bool = False,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    config: AttnConfig | None = None,
) -> torch.Tensor:
    """Attention on packed tokens: ``q, k, v`` are ``[T, H, D]`` (any token/head strides),
    sequence ``b`` is rows ``cu_seqlens[b]:cu_seqlens[b+1]``. ``max_seqlen`` bounds the longest
    sequence (it sizes the grid; it may be larger than the true maximum). Returns ``[T, H, D]``."""
    _check_qkv(q, k, v, 3, "varlen_attention")
    t, h, d = q.shape
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"varlen_attention: cu_seqlens must be 1-D int32/int64, got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    batch = cu_seqlens.shape[0] - 1
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = out if out is not None else torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    if t == 0 or batch <= 0:
        return o
    strides = tuple((0, x.stride(1), x.stride(0)) for x in (q, k, v, o))
    _launch(q, k, v, o, strides, None, (0, 0, 0, 0), MASK_NONE, cu_seqlens, batch, h, max_seqlen, max_seqlen, scale, causal, config)  # type: ignore[arg-type]
    return o


AUTOTUNE = os.environ.get("KFUSE_ATTN_AUTOTUNE", "1") == "1"


def worth_timing(cfg: AttnConfig, max_seq: int, batch_heads: int, sms: int) -> bool:
    """Whether the autotuner times ``cfg`` for this problem. A paired config whose grid would hold
    fewer programs than the GPU has SMs is skipped: pairing halves the programs, and where they no
    longer fill the machine it was slower (Llama-1b B1 S512: 13.86 against 13.44 us unpaired, 128
    programs on 132 SMs; session 24), so compiling and timing it only adds compile time."""
    if not cfg.paired:
        return True
    return triton.cdiv(triton.cdiv(max(max_seq, 1), cfg.block_m), 2) * batch_heads >= sms


def _measure_best(run, head_dim: int, causal: bool = False, rounds: int = 5, max_seq: int = 0, batch_heads: int = 0) -> AttnConfig:  # noqa: ANN001 - run: AttnConfig -> None
    """Time every config of the space with ``run`` and return the fastest. Each config runs 10
    times in one CUDA graph (a short kernel's graph launch would otherwise be most of what is
    timed), and the configs are timed in ``rounds`` rotated rounds, keeping each one's median:
    one-shot timings picked tiles 40% apart in two runs at Llama-1b B1 causal (session 23).
    ``max_seq`` and ``batch_heads`` (the grid) drop paired configs that cannot fill the GPU."""
    from kfuse.bench.harness import cuda_graph_callable, time_ms
    from kfuse.runtime.unfused import AgreeingOutputs

    calls = 10
    replays = {}
    outputs = AgreeingOutputs()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    space = [c for c in config_space(head_dim, causal) if not batch_heads or worth_timing(c, max_seq, batch_heads, sms)]
    for c in space:
        try:
            out = run(c)  # compile and warm up outside the capture
            if isinstance(out, torch.Tensor):
                outputs.add(c, out)
            replays[c] = cuda_graph_callable(lambda c=c: run(c), (), calls=calls)
        except Exception as e:  # a config the compiler rejects (out of resources) is skipped; a GPU fault stops the compile
            cuda_fault.check(e, f"attention config {c}")
    if outputs.groups:  # a tile whose output disagrees with most tiles' (a miscompile) is not timed
        agree, _ = outputs.agreeing(prefer=default_config(max_seq, batch_heads, head_dim) if batch_heads else None)
        replays = {c: r for c, r in replays.items() if c in agree}
    if not replays:
        raise RuntimeError("attention: no config of the space ran")
    return pick_fastest(list(replays), lambda c: time_ms(replays[c], warmup=2, rep=5) / calls, rounds)


def pick_fastest(configs: list[AttnConfig], time_one, rounds: int) -> AttnConfig:  # noqa: ANN001 - time_one: AttnConfig -> float
    """The config with the lowest median time over ``rounds`` rotated rounds (``interleaved_medians``)."""
    from kfuse.bench.harness import interleaved_medians

    medians = interleaved_medians(configs, time_one, rounds)
    return min(medians, key=medians.__getitem__)


def problem_key(
    max_seq: int, head_dim: int, mask_kind: int, causal: bool, varlen: bool, batch_heads: int, mask_streamed: bool = False
) -> tuple:
    """What the autotuner keys its pick by: problems with the same key share a tile. ``mask_streamed``: a
    dense mask that differs per batch entry, read from memory once a program, against one broadcast over
    the batch that stays in L2. Swin-V2-T's shifted and unshifted windows had one key: the tile timed on
    the broadcast relative-position bias (several within noise there) then ran the 50 MB shifted mask, and
    two compiles of the same plan ran the attention in 246 and 739 us (session 41)."""
    return (max_seq, head_dim, mask_kind, bool(causal), bool(varlen), batch_heads, bool(mask_streamed))


def tuned_configs() -> dict[tuple, AttnConfig]:
    """The configs chosen so far, by ``problem_key``."""
    return dict(_TUNED)


def tuned_config(
    max_seq: int,
    head_dim: int,
    batch_heads: int,
    causal: bool = False,
    mask_kind: int = MASK_NONE,
    varlen: bool = False,
    mask_streamed: bool = False,
) -> AttnConfig | None:
    """The config the autotuner picked for this problem, or None before its first GPU launch."""
    return _TUNED.get(problem_key(max_seq, head_dim, mask_kind, causal, varlen, batch_heads, mask_streamed))


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    mask_kind: int = MASK_NONE,
    causal: bool = False,
    scale: float | None = None,
    mask2: torch.Tensor | None = None,
) -> torch.Tensor:
    """The oracle for ``attention`` in float32: softmax(q k^T * scale + mask (+ mask2)) v; all-masked rows are 0.
    K and V with fewer heads than Q (grouped-query) are repeated to Q's heads."""
    qf, kf, vf = q.float(), k.float(), v.float()
    b, h, sq, d = q.shape
    if k.shape[1] != h:
        kf, vf = (x.repeat_interleave(h // k.shape[1], dim=1) for x in (kf, vf))
    sk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    allowed = torch.ones((b, h, sq, sk), dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed & torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
    if mask is not None and mask_kind == MASK_KEY_PADDING:
        allowed = allowed & (mask != 0)[:, None, None, :]
    elif mask is not None and mask_kind == MASK_DENSE_BOOL:
        allowed = allowed & mask.bool()
    elif mask is not None and mask_kind == MASK_DENSE_ADD:
        s = s + mask.float()
    if mask2 is not None:
        s = s + mask2.float()
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.matmul(p, vf)


def varlen_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """The oracle for ``varlen_attention``: each sequence on its own, in float32."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cu = cu_seqlens.tolist()
    for i in range(len(cu) - 1):
        a, e = cu[i], cu[i + 1]
        if e > a:
            sl = slice(a, e)
            qs, ks, vs = (x[sl].transpose(0, 1)[None] for x in (q, k, v))
            out[sl] = reference(qs, ks, vs, causal=causal, scale=scale)[0].transpose(0, 1)
    return out
