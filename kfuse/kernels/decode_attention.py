"""Attention for decoding: a few query rows against a long key/value cache, split along the keys.

A decode step asks one query token per sequence (``Sq`` = 1, a few with speculative tokens) to attend
over the whole cache. The dense kernel (``kfuse.kernels.attention``) gives each (batch, head) one program
for its query tile: at batch 1 with 32 heads that is 32 programs on 132 SMs, each walking the whole cache
alone, and its 64-row query tile holds one valid row. Two changes fit the shape instead:

- **the query heads of one key/value head share a program** (grouped-query attention): the G heads'
  rows (G x Sq of them) are the rows of one tile, so each key/value tile is loaded once for the group,
  not G times, and the tensor-core tile is G x Sq rows full, not 1;
- **split-KV** (flash-decoding): the cache is cut into ``splits`` chunks, one program each, which write
  their unnormalised output with its row max and row sum (fp32); a second kernel rescales and sums the
  chunks. The grid is batch x kv-heads x splits, sized to fill the GPU. With one chunk (``splits=1``: a large
  batch fills the GPU alone, or a short cache) the program writes the output itself, and nothing is combined.
  With ``combine="last"`` there is no second kernel either: each program counts itself done on its (batch, kv
  head)'s counter (acquire-release, as ``skinny_gemm``'s split-K), and the program that arrives last merges the
  chunks' partials from L2 and writes the output. A decode step saves a launch a layer (~2-4 us each in a CUDA
  graph); the merge is G x Sq rows of ``splits`` partials, a few KB read by one program.

The query's rotary embedding may be applied as the kernel reads the query (``cos`` / ``sin``: rotate_half or
rotate_every_two pairing, all or the first ``rotary_dims`` columns, in fp32 and rounded to the query's dtype, as
``kfuse.kernels.rotary`` computes it): a decode layer's rotary launch for the query is then folded in
(``kfuse.passes.fuse_query_rotary``).

Masks are the dense kind (a bool or additive mask broadcastable to ``[B, H, Sq, Sk]``, as Hugging Face
builds for a static cache's unfilled slots) or none; no causal flag (one query row per sequence has none
to apply; with several, the mask carries it). Rows whose keys are all masked give zeros, as the dense
kernel's do. ``reference`` is the PyTorch oracle.

Floor (TinyLlama-1.1B, B1, a 1,024-slot cache, fp16): each layer's attention reads K and V once, 2 x 1024 x
4 x 64 x 2 B = 1 MB, ~0.25 us at 4.3 TB/s; the dense kernel's 32 programs each stream their group's 256 KB.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kfuse.kernels import pdl
from kfuse.kernels.attention import dot_precision
from kfuse.kernels.codegen import KeptBuffers, num_sms
from kfuse.kernels.pdl import pdl_start

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
MAX_ROWS = 64  # G x Sq query rows a program holds; past that the dense kernel's tiles fit the problem
LAST_MAX_ROWS = 32  # the in-kernel merge's [rows, D] fp32 sum beside the loop's spills at 64 rows (sm_90): those take the launch
_LOG2E = 1.4426950408889634


@triton.jit
def _decode_split(
    q_ptr, k_ptr, v_ptr, mask_ptr, acc_ptr, ml_ptr, cos_ptr, sin_ptr, o_ptr, count_ptr,
    qk_scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs,
    smb, smh, sms, smn,
    scb, sch, scs, scd, ssb, ssh, sss, ssd, sob, soh, sos,
    heads, kv_heads, sq, sk, d, group, chunk, splits, rot_half,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASK_KIND: tl.constexpr, PRECISION: tl.constexpr,
    ROTARY: tl.constexpr, SINGLE: tl.constexpr, LAST_COMBINES: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    bk = tl.program_id(0)  # batch x kv head
    split = tl.program_id(1)
    b = bk // kv_heads
    hk = bk % kv_heads
    rows = tl.arange(0, BLOCK_R)  # row r: query head hk * group + r // sq, query position r % sq
    head = hk * group + rows // sq
    pos = rows % sq
    row_ok = rows < group * sq
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < d
    q_rows = q_ptr + b * sqb + head[:, None] * sqh + pos[:, None] * sqs
    q = tl.load(q_rows + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if ROTARY != 0:  # the query's rotary embedding, applied as it is read (1: rotate_half, 2: rotate_every_two)
        rot_ok = dims < 2 * rot_half
        if ROTARY == 1:  # column i pairs with i + rd/2: out = x * cos + cat(-x2, x1) * sin
            partner = tl.where(dims < rot_half, dims + rot_half, dims - rot_half)
            sign = tl.where(dims < rot_half, -1.0, 1.0)
        else:  # column 2i pairs with 2i + 1
            partner = dims ^ 1
            sign = tl.where(dims % 2 == 0, -1.0, 1.0)
        rmask = row_ok[:, None] & rot_ok[None, :]
        qp = tl.load(q_rows + partner[None, :], mask=rmask, other=0.0).to(tl.float32)
        cs = tl.load(cos_ptr + b * scb + head[:, None] * sch + pos[:, None] * scs + dims[None, :] * scd, mask=rmask, other=1.0)
        sn = tl.load(sin_ptr + b * ssb + head[:, None] * ssh + pos[:, None] * sss + dims[None, :] * ssd, mask=rmask, other=0.0)
        rotated = q.to(tl.float32) * cs.to(tl.float32) + sign[None, :] * qp * sn.to(tl.float32)
        q = tl.where(rot_ok[None, :], rotated, q.to(tl.float32)).to(q_ptr.dtype.element_ty)
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, sk)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < hi
        kt = tl.load(k_ptr + b * skb + hk * skh + keys[None, :] * sks + dims[:, None], mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # log2 units: exp2 below
        allowed = row_ok[:, None] & key_ok[None, :]
        if MASK_KIND != 0:
            mp = mask_ptr + b * smb + head[:, None] * smh + pos[:, None] * sms + keys[None, :] * smn
            mv = tl.load(mp, mask=allowed, other=0)
            if MASK_KIND == 1:
                allowed = allowed & (mv != 0)
            else:
                s += mv.to(tl.float32) * 1.4426950408889634
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key allowed yet: keep the sums at zero, not NaN
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = tl.load(v_ptr + b * svb + hk * svh + keys[:, None] * svs + dims[None, :], mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        m_i = m_new
    if SINGLE:  # one chunk: the output itself, no partials and no combine launch (rows with no key allowed: zeros)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_rows = o_ptr + b * sob + head[:, None] * soh + pos[:, None] * sos
        tl.store(o_rows + dims[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    else:  # partials of (batch, query head, position, split): acc [.., D], then (row max, row sum)
        first = ((b * heads + head) * sq + pos) * splits  # the row's first partial
        slot = first + split
        tl.store(acc_ptr + slot[:, None] * BLOCK_D + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(ml_ptr + slot * 2, m_i, mask=row_ok)
        tl.store(ml_ptr + slot * 2 + 1, l_i, mask=row_ok)
        if LAST_COMBINES:
            tl.debug_barrier()  # every thread's partial is stored before the count says so
            if tl.atomic_add(count_ptr + bk, 1, sem="acq_rel") == splits - 1:
                _merge_chunks(acc_ptr, ml_ptr, o_ptr, first, row_ok, dims, b, head, pos, sob, soh, sos, d, splits, BLOCK_R, BLOCK_D)
                tl.store(count_ptr + bk, 0)  # the next call's count starts from zero


@triton.jit
def _merge_chunks(acc_ptr, ml_ptr, o_ptr, first, row_ok, dims, b, head, pos, sob, soh, sos, d, splits,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    # the last program of a (batch, kv head): its rows' chunks merged as flash attention merges key tiles (each
    # chunk's sums were taken against its own max), read from L2 (.cg: other SMs wrote them)
    m_run = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for c in range(splits):
        m_c = tl.load(ml_ptr + (first + c) * 2, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        l_c = tl.load(ml_ptr + (first + c) * 2 + 1, mask=row_ok, other=0.0, cache_modifier=".cg")
        a_c = tl.load(acc_ptr + (first + c)[:, None] * BLOCK_D + dims[None, :], mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m_run, m_c)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key allowed in any chunk so far: sums stay zero
        alpha = tl.exp2(m_run - m_safe)
        beta = tl.exp2(m_c - m_safe)
        l_run = l_run * alpha + l_c * beta
        acc = acc * alpha[:, None] + a_c * beta[:, None]
        m_run = m_new
    out = acc / tl.where(l_run > 0, l_run, 1.0)[:, None]  # all keys masked: zeros
    o_rows = o_ptr + b * sob + head[:, None] * soh + pos[:, None] * sos
    tl.store(o_rows + dims[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (dims < d)[None, :])


@triton.jit
def _decode_combine(
    acc_ptr, ml_ptr, o_ptr,
    sob, soh, sos,
    heads, sq, d, splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    row = tl.program_id(0)  # (batch, head, position)
    b = row // (heads * sq)
    h = (row // sq) % heads
    i = row % sq
    parts = tl.arange(0, BLOCK_S)
    part_ok = parts < splits
    dims = tl.arange(0, BLOCK_D)
    m = tl.load(ml_ptr + (row * splits + parts) * 2, mask=part_ok, other=float("-inf"))
    row_sum = tl.load(ml_ptr + (row * splits + parts) * 2 + 1, mask=part_ok, other=0.0)
    m_all = tl.max(m, 0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(m - m_all)  # each chunk's sums were taken against its own max (log2 units)
    acc = tl.load(acc_ptr + (row * splits + parts)[:, None] * BLOCK_D + dims[None, :], mask=part_ok[:, None], other=0.0)
    total = tl.sum(w * row_sum, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)  # all keys masked: zeros
    tl.store(o_ptr + b * sob + h * soh + i * sos + dims, out.to(o_ptr.dtype.element_ty), mask=dims < d)


def applies(q_shape: tuple[int, ...], k_shape: tuple[int, ...], causal: bool) -> bool:
    """Whether the decode kernel takes this problem: no causal flag, and the query rows of one key/value
    head (its G query heads x Sq positions) fit one tile."""
    if causal or len(q_shape) != 4 or len(k_shape) != 4 or k_shape[1] == 0 or q_shape[1] % k_shape[1]:
        return False
    return (q_shape[1] // k_shape[1]) * q_shape[2] <= MAX_ROWS and q_shape[3] <= 256


def default_splits(batch_kv_heads: int, sk: int, block_n: int, sms: int) -> int:
    """Chunks per (batch, kv head): about two programs per SM in all (at most 64 chunks), each with a key tile at least."""
    most = max(1, triton.cdiv(sk, block_n))
    return max(1, min(most, triton.cdiv(2 * sms, max(batch_kv_heads, 1)), 64))


def _sms(device: torch.device) -> int:
    # the interpreter: 4, a few chunks, so the combine step is always exercised; ``codegen.sm_count`` respected
    return num_sms(device, 4)


_BUFFERS = KeptBuffers()


def _buffers(device: torch.device, owner: int, slots: int, block_d: int, groups: int) -> tuple[torch.Tensor, ...]:
    """The partials and per-(batch, kv head) counters of ``combine="last"`` launches of one shape and owner."""
    return _BUFFERS.get(
        (str(device), owner, slots, block_d, groups),
        lambda: (torch.empty((slots, block_d), dtype=torch.float32, device=device),
                 torch.empty((slots, 2), dtype=torch.float32, device=device),
                 torch.zeros(groups, dtype=torch.int32, device=device)),
    )  # fmt: skip


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    splits: int | None = None,
    block_n: int = 64,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rotary_dims: int | None = None,
    interleaved: bool = False,
    combine: str = "launch",
    owner: int = 0,
) -> torch.Tensor:
    """Attention of ``q`` ``[B, H, Sq, D]`` over ``k``, ``v`` ``[B, H / G, Sk, D]`` (grouped-query: query head
    ``h`` reads key/value head ``h // G``), any strides with a contiguous head dim. ``mask``: bool (True =
    attend) or additive, broadcastable to ``[B, H, Sq, Sk]``. With ``cos`` / ``sin`` (broadcastable to
    ``[B, H, Sq, rotary_dims]``) the query is ``rotary(q, cos, sin, rotary_dims, interleaved)`` first, applied as
    it is read. ``combine``: how several chunks become the output, ``"launch"`` (a second kernel) or ``"last"``
    (the last program of a key/value head merges them: one launch, where its G x Sq rows fit ``LAST_MAX_ROWS``,
    else the second kernel all the same; its partials and counters are kept per
    ``owner`` and launch shape, so calls of one owner must not run concurrently). Returns ``[B, H, Sq, D]`` (or
    writes ``out``, any strides)."""
    if combine not in ("launch", "last"):
        raise ValueError(f"decode_attention: combine must be 'launch' or 'last', got {combine!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4 or t.stride(-1) != 1:
            raise ValueError(f"decode_attention: {name} must be 4-D with a contiguous head dim, got {tuple(t.shape)} {t.stride()}")
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if not applies(tuple(q.shape), tuple(k.shape), False) or k.shape[0] != b or v.shape != k.shape or k.shape[3] != d:
        raise ValueError(f"decode_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} is not a decode problem it takes")
    group = h // hk
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = out if out is not None else torch.empty((b, h, sq, d), dtype=q.dtype, device=q.device)
    if b * h * sq == 0:
        return o
    kind, m, ms = MASK_NONE, o, (0, 0, 0, 0)
    if mask is not None:
        kind = MASK_BOOL if mask.dtype == torch.bool else MASK_ADD
        m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
        m4 = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape)) if m.dim() < 4 else m
        try:
            m = m4.expand(b, h, sq, sk)
        except RuntimeError:
            raise ValueError(f"decode_attention: mask {tuple(mask.shape)} does not broadcast to [{b}, {h}, {sq}, {sk}]") from None
        ms = tuple(m.stride())
    rot_kind, c4, s4 = 0, q, q
    rd = d if rotary_dims is None else rotary_dims
    if cos is not None and sin is not None:
        from kfuse.kernels.rotary import broadcast_cos_sin

        if rd % 2 or not 0 < rd <= d:
            raise ValueError(f"decode_attention: an even number of rotated dims up to {d} is needed, got {rd}")
        rot_kind = 2 if interleaved else 1
        c4, s4 = broadcast_cos_sin(cos, sin, torch.Size((b, h, sq, rd)), q.shape)
    cs = tuple(c4.stride()) if rot_kind else (0, 0, 0, 0)
    ss = tuple(s4.stride()) if rot_kind else (0, 0, 0, 0)
    block_d = max(16, triton.next_power_of_2(d))
    n = splits or default_splits(b * hk, sk, block_n, _sms(q.device))
    chunk = triton.cdiv(max(sk, 1), n)
    n = triton.cdiv(max(sk, 1), chunk)  # no empty chunk at the end
    single = n == 1
    block_r = max(16, triton.next_power_of_2(group * sq))
    last = combine == "last" and not single and block_r <= LAST_MAX_ROWS
    count = o
    if last:
        acc, ml, count = _buffers(q.device, owner, b * h * sq * n, block_d, b * hk)
    else:
        acc = o if single else torch.empty((b * h * sq * n, block_d), dtype=torch.float32, device=q.device)
        ml = o if single else torch.empty((b * h * sq * n, 2), dtype=torch.float32, device=q.device)
    pdl_kw = pdl.launch_kwargs()
    _decode_split[(b * hk, n)](
        q, k, v, m, acc, ml, c4, s4, o, count, scale * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        *ms, *cs, *ss, o.stride(0), o.stride(1), o.stride(2), h, hk, sq, sk, d, group, chunk, n, rd // 2,
        BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_D=block_d, MASK_KIND=kind,
        PRECISION=dot_precision(q.dtype), ROTARY=rot_kind, SINGLE=single, LAST_COMBINES=last,
        num_warps=4, **pdl_kw,
    )  # fmt: skip
    if single or last:
        return o
    _decode_combine[(b * h * sq,)](
        acc, ml, o, o.stride(0), o.stride(1), o.stride(2), h, sq, d, n,
        BLOCK_S=max(2, triton.next_power_of_2(n)), BLOCK_D=block_d, num_warps=1 if block_d <= 64 else 2, **pdl_kw,
    )  # fmt: skip
    return o


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, scale: float | None = None
) -> torch.Tensor:
    """PyTorch's SDPA in fp32 with the key/value heads repeated per group; rows with no allowed key are zeros."""
    g = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(g, dim=1) for t in (k, v))
    m = mask
    if m is not None and m.dtype != torch.bool:
        m = m.float()
    o = torch.nn.functional.scaled_dot_product_attention(q.float(), kf, vf, attn_mask=m, scale=scale)
    if mask is not None and mask.dtype == torch.bool:
        dead = ~mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]).any(-1, keepdim=True)
        o = o.masked_fill(dead, 0.0)
    return o.to(q.dtype)
