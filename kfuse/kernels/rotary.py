"""Rotary position embedding in one kernel: ``x * cos + rotate_half(x) * sin``.

``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])`` (Llama, Mistral, GPT-NeoX). Unfused, PyTorch
(and a fusion of the elementwise ops alone) runs it as a negation, a concatenation copy and a
multiply-add, three launches that each read and write the tensor. One program here owns BLOCK_R rows
and reads each row's two halves once:

    out[:D/2] = x1 * cos[:D/2] - x2 * sin[:D/2]
    out[D/2:] = x2 * cos[D/2:] + x1 * sin[D/2:]

``x`` is any 4-D strided view (the head-split view of a QKV projection, or a slice of it when only
part of the head dim rotates); ``cos`` and ``sin`` are read through broadcast strides (stride 0 over
the batch or head dims), so nothing is materialised. Arithmetic is fp32; the output takes any strides.
``write_rows`` writes the rows at the positions an index names instead (a KV cache's update: the key's rotary
embedding and its ``index_copy`` in one pass; the value's rows without rotation).

``INTERLEAVED`` (GPT-J, CodeGen, Cohere, RoFormer: ``rotate_every_two``) pairs column 2i with 2i + 1 instead
of i with i + D/2; the same code reads the pairs through the column map, at stride 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels import pdl
from kfuse.kernels.codegen import interpreting, num_sms
from kfuse.kernels.pdl import pdl_start


@triton.jit
def _rows(
    X, C, S, Out, OutIdx, IdxOffset,
    R1, R2, n_rows, HALF, N_PASS, n_slots,
    sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3, so0, so1, so2, so3,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, INTERLEAVED: tl.constexpr, OUT_INDEX: tl.constexpr,
    INDEX_OFFSET: tl.constexpr, ROTATE: tl.constexpr,
):  # fmt: skip
    # one program's BLOCK_R rows of X, rotated (ROTATE) or as they are, into Out (at the index's rows: OUT_INDEX)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < n_rows)[:, None] & (cols < HALF)[None, :]
    # row -> (i0, i1, i2) over the three leading dims, for the strided operands
    i2 = rows % R2
    i1 = (rows // R2) % R1
    i0 = rows // (R2 * R1)
    xr = (i0 * sx0 + i1 * sx1 + i2 * sx2)[:, None]
    cr = (i0 * sc0 + i1 * sc1 + i2 * sc2)[:, None]
    sr = (i0 * ss0 + i1 * ss1 + i2 * ss2)[:, None]
    if INTERLEAVED:  # pairs (2i, 2i + 1)
        lo, hi = (2 * cols)[None, :], (2 * cols + 1)[None, :]
    else:  # pairs (i, i + D/2)
        lo, hi = cols[None, :], (cols + HALF)[None, :]
    # the output row: (i0, i1, i2) through the output's strides, or (i0, i1, OutIdx[i2]) where the rows land at
    # the positions an index names (a KV cache's slots: kfuse.runtime.transformer_ops' cache_write)
    if OUT_INDEX:  # a position past the cache is not written (PyTorch's index_copy raises there; no stray store here)
        o2 = tl.load(OutIdx + i2, mask=rows < n_rows, other=0)
        if INDEX_OFFSET:  # the positions as a base plus a one-element offset (a cache's arange + its length)
            o2 += tl.load(IdxOffset)
        mask = mask & ((o2 >= 0) & (o2 < n_slots))[:, None]
    else:
        o2 = i2
    out = Out + (i0 * so0 + i1 * so1 + o2 * so2)[:, None]
    x1 = tl.load(X + xr + lo * sx3, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + xr + hi * sx3, mask=mask, other=0.0).to(tl.float32)
    if ROTATE:
        c1 = tl.load(C + cr + lo * sc3, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(C + cr + hi * sc3, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(S + sr + lo * ss3, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(S + sr + hi * ss3, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + lo * so3, (x1 * c1 - x2 * s1).to(Out.dtype.element_ty), mask=mask)
        tl.store(out + hi * so3, (x2 * c2 + x1 * s2).to(Out.dtype.element_ty), mask=mask)
    else:  # the rows as they are (a value cache's write)
        tl.store(out + lo * so3, x1.to(Out.dtype.element_ty), mask=mask)
        tl.store(out + hi * so3, x2.to(Out.dtype.element_ty), mask=mask)
    if BLOCK_P > 0:  # partial rotary: the columns past the rotated ones are copied (the model's cat)
        pc = (2 * HALF + tl.arange(0, BLOCK_P))[None, :]
        pm = (rows < n_rows)[:, None] & (pc < 2 * HALF + N_PASS)
        if OUT_INDEX:
            pm = pm & ((o2 >= 0) & (o2 < n_slots))[:, None]
        tl.store(out + pc * so3, tl.load(X + xr + pc * sx3, mask=pm, other=0.0).to(Out.dtype.element_ty), mask=pm)


@triton.jit
def _rotary_fwd(
    X, C, S, Out, OutIdx, IdxOffset,
    R1, R2, n_rows, HALF, N_PASS, n_slots,
    sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3, so0, so1, so2, so3,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, INTERLEAVED: tl.constexpr, OUT_INDEX: tl.constexpr,
    INDEX_OFFSET: tl.constexpr, ROTATE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    _rows(X, C, S, Out, OutIdx, IdxOffset, R1, R2, n_rows, HALF, N_PASS, n_slots,
          sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3, so0, so1, so2, so3,
          BLOCK_R, BLOCK_H, BLOCK_P, INTERLEAVED, OUT_INDEX, INDEX_OFFSET, ROTATE)  # fmt: skip


@triton.jit
def _write_pair_fwd(
    X, C, S, Out, X2, Out2, OutIdx, IdxOffset,
    R1, R2, n_rows, HALF, N_PASS, n_slots,
    sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3, so0, so1, so2, so3,
    tx0, tx1, tx2, tx3, to0, to1, to2, to3,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, INTERLEAVED: tl.constexpr,
    INDEX_OFFSET: tl.constexpr, ROTATE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # two cache writes at the same positions in one launch (a layer's keys, rotated or not, and its values):
    # program_id(1) picks the job
    pdl_start(PDL)
    if tl.program_id(1) == 0:
        _rows(X, C, S, Out, OutIdx, IdxOffset, R1, R2, n_rows, HALF, N_PASS, n_slots,
              sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3, so0, so1, so2, so3,
              BLOCK_R, BLOCK_H, BLOCK_P, INTERLEAVED, True, INDEX_OFFSET, ROTATE)  # fmt: skip
    else:
        _rows(X2, C, S, Out2, OutIdx, IdxOffset, R1, R2, n_rows, HALF, N_PASS, n_slots,
              tx0, tx1, tx2, tx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3, to0, to1, to2, to3,
              BLOCK_R, BLOCK_H, BLOCK_P, INTERLEAVED, True, INDEX_OFFSET, False)  # fmt: skip


def _as_4d(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``t`` broadcast to the 4-D ``shape`` (a view: stride 0 on broadcast dims)."""
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t
    return t.expand(shape)


def broadcast_cos_sin(cos: torch.Tensor, sin: torch.Tensor, shape: torch.Size, x_shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` broadcast to ``shape``; a ValueError naming both where they do not (``expand``'s own
    error is a RuntimeError that names neither)."""
    try:
        return _as_4d(cos, shape), _as_4d(sin, shape)
    except RuntimeError:
        raise ValueError(f"rotary: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} do not broadcast to x {tuple(x_shape)}") from None


def launch_config(n_rows: int, block_h: int, sms: int = 132) -> tuple[int, int]:
    """(rows a program, warps): up to 4096 elements a program, fewer rows until every SM has two
    programs (GPT-NeoX's partial rotary, 6144 rows of 8 + 8 columns: 64 rows = 96 programs took 7.6 us),
    and a warp for every 256 elements (8 a thread), at most 4."""
    if interpreting():
        return 16, 4
    rows = max(1, min(64, 4096 // block_h))
    while rows > 1 and -(-n_rows // rows) < 2 * sms:
        rows //= 2
    return rows, max(1, min(4, rows * block_h // 256))


def rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    out: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    block_r: int | None = None,
    num_warps: int | None = None,
    rotary_dims: int | None = None,
    interleaved: bool = False,
) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` of rank <= 4 with an even last dim; ``cos`` and
    ``sin`` broadcast to ``x``. Returns a contiguous tensor of ``dtype`` (default ``x.dtype``), or
    writes ``out`` (x's shape, any strides). ``block_r`` (rows a program) and ``num_warps`` override ``launch_config``.
    ``rotary_dims``: only the first ``rotary_dims`` columns rotate (``cos``/``sin`` have that width), the
    rest are copied: ``cat([rotary(x[..., :r]), x[..., r:]], -1)`` (GPT-NeoX, Phi) in one pass.
    ``interleaved``: ``rotate_every_two`` (GPT-J), pairing columns 2i and 2i + 1."""
    rd = x.shape[-1] if rotary_dims is None else rotary_dims
    if x.dim() > 4 or x.dim() < 1 or rd % 2 or not 0 < rd <= x.shape[-1]:
        raise ValueError(f"rotary: x must have rank 1-4 and an even number of rotated dims, got shape {tuple(x.shape)}, {rd} rotated")
    shape = x.shape
    x4 = _as_4d(x, torch.Size((1,) * (4 - x.dim()) + tuple(shape)))
    c4, s4 = broadcast_cos_sin(cos, sin, x4.shape[:-1] + (rd,), shape)
    o = out if out is not None else torch.empty(shape, dtype=dtype or x.dtype, device=x.device)
    if o.shape != shape:
        raise ValueError(f"rotary: out has shape {tuple(o.shape)}, not x's {tuple(shape)}")
    _launch(x4, c4, s4, o, None, rd, interleaved, True, block_r, num_warps)
    return o


def write_rows(
    x: torch.Tensor,
    out: torch.Tensor,
    index: torch.Tensor,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rotary_dims: int | None = None,
    interleaved: bool = False,
    index_offset: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out.index_copy_(2, index, rotary(x, cos, sin))`` (or of ``x`` itself without ``cos`` / ``sin``) in one
    pass: a KV cache's update with the key's rotary embedding. ``x`` is ``[B, H, T, D]`` (any strides), ``out``
    ``[B, H, L, D]`` (any strides), ``index`` ``T`` positions in ``[0, L)``; writes ``out`` and returns it.
    ``index_offset`` (one integer element): the positions are ``index + index_offset``, added as the kernel reads
    them (transformers' static cache computes ``arange(T) + length`` in a launch of its own a layer)."""
    c4, s4, rd, rotate = _row_write_operands("write_rows", x, out, index, cos, sin, rotary_dims, index_offset)
    _launch(x, c4, s4, out, index.contiguous(), rd, interleaved and rotate, rotate, None, None, index_offset)
    return out


def write_rows_pair(
    x: torch.Tensor,
    out: torch.Tensor,
    x2: torch.Tensor,
    out2: torch.Tensor,
    index: torch.Tensor,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    rotary_dims: int | None = None,
    interleaved: bool = False,
    index_offset: torch.Tensor | None = None,
) -> None:
    """``write_rows(x, out, index, cos, sin, ...)`` and ``write_rows(x2, out2, index)`` (no rotary) in one launch: a
    decode layer's keys and values written at the same positions (``kfuse.runtime.state_writes.pair_cache_writes``).
    ``x2`` and ``out2`` have ``x``'s and ``out``'s shapes and dtypes (any strides)."""
    if x2.shape != x.shape or out2.shape != out.shape or x2.dtype != x.dtype or out2.dtype != out.dtype:
        raise ValueError(
            f"write_rows_pair: the second job's x {tuple(x2.shape)} {x2.dtype} / out {tuple(out2.shape)} {out2.dtype} differ from "
            f"the first's {tuple(x.shape)} {x.dtype} / {tuple(out.shape)} {out.dtype}"
        )
    c4, s4, rd, rotate = _row_write_operands("write_rows_pair", x, out, index, cos, sin, rotary_dims, index_offset)
    _launch(x, c4, s4, out, index.contiguous(), rd, interleaved and rotate, rotate, None, None, index_offset, pair=(x2, out2))


def _row_write_operands(
    who: str, x: torch.Tensor, out: torch.Tensor, index: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
    rotary_dims: int | None, index_offset: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, int, bool]:  # fmt: skip
    """A cache write's checked operands: (cos, sin broadcast to the rows, or ``x`` as a placeholder; the rotated
    width; whether it rotates)."""
    if x.dim() != 4 or out.dim() != 4 or out.shape[:2] != x.shape[:2] or out.shape[3] != x.shape[3]:
        raise ValueError(f"{who}: x {tuple(x.shape)} and out {tuple(out.shape)} are not [B, H, T, D] and [B, H, L, D]")
    if index.dim() != 1 or index.shape[0] != x.shape[2] or index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{who}: index must be {x.shape[2]} int32/int64 positions, got {index.dtype} {tuple(index.shape)}")
    if index_offset is not None and (index_offset.numel() != 1 or index_offset.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"{who}: index_offset must be one int32/int64 element, got {index_offset.dtype} {tuple(index_offset.shape)}")
    rotate = cos is not None and sin is not None
    rd = x.shape[-1] if rotary_dims is None or not rotate else rotary_dims
    if rd % 2:
        raise ValueError(f"{who}: an even number of columns is needed, got {rd}")
    c4 = s4 = x
    if rotate:
        c4, s4 = broadcast_cos_sin(cos, sin, x.shape[:-1] + (rd,), x.shape)  # type: ignore[arg-type]
    return c4, s4, rd, rotate


def _launch(
    x4: torch.Tensor, c4: torch.Tensor, s4: torch.Tensor, o: torch.Tensor, out_index: torch.Tensor | None, rd: int,
    interleaved: bool, rotate: bool, block_r: int | None, num_warps: int | None, index_offset: torch.Tensor | None = None,
    pair: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:  # fmt: skip
    """One launch of ``_rotary_fwd``; with ``pair`` (x2, out2: a second cache write at ``out_index``, not rotated)
    one of ``_write_pair_fwd``, the two jobs side by side on the grid's second axis."""
    r0, r1, r2, d = x4.shape
    n_rows = r0 * r1 * r2
    if n_rows == 0 or d == 0:
        return
    o4 = o if out_index is not None or o.dim() == 4 else o.view((1,) * (4 - o.dim()) + tuple(o.shape))  # a view: writes land in o
    half, n_pass = rd // 2, d - rd
    block_h = max(16, triton.next_power_of_2(half))
    block_p = triton.next_power_of_2(n_pass) if n_pass else 0
    jobs = 1 if pair is None else 2
    auto_r, auto_w = launch_config(jobs * n_rows, block_h, num_sms(x4.device, 132))
    block_r, num_warps = block_r or auto_r, num_warps or auto_w
    index = out_index if out_index is not None else o4
    offset = index_offset if index_offset is not None else o4
    common = (r1, r2, n_rows, half, n_pass, o4.shape[2], *x4.stride(), *c4.stride(), *s4.stride(), *o4.stride())
    meta = {"BLOCK_R": block_r, "BLOCK_H": block_h, "BLOCK_P": block_p, "INTERLEAVED": interleaved,
            "INDEX_OFFSET": index_offset is not None, "ROTATE": rotate, "num_warps": num_warps}  # fmt: skip
    if pair is None:
        _rotary_fwd[(triton.cdiv(n_rows, block_r),)](
            x4, c4, s4, o4, index, offset, *common, OUT_INDEX=out_index is not None, **meta, **pdl.launch_kwargs()
        )
    else:
        x2, o2 = pair
        _write_pair_fwd[(triton.cdiv(n_rows, block_r), 2)](
            x4, c4, s4, o4, x2, o2, index, offset, *common, *x2.stride(), *o2.stride(), **meta, **pdl.launch_kwargs()
        )


def reference(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dims: int | None = None, interleaved: bool = False
) -> torch.Tensor:
    """The oracle, as Hugging Face writes it (in float32)."""
    xf = x.float()
    rd = x.shape[-1] if rotary_dims is None else rotary_dims
    xr, h = xf[..., :rd], rd // 2
    if interleaved:
        rot = torch.stack((-xr[..., 1::2], xr[..., ::2]), dim=-1).flatten(-2)
    else:
        rot = torch.cat((-xr[..., h:], xr[..., :h]), dim=-1)
    return torch.cat((xr * cos.float() + rot * sin.float(), xf[..., rd:]), dim=-1)
