"""Rotary position embedding in one kernel: ``x * cos + rotate_half(x) * sin``.

``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])`` (Llama, Mistral, GPT-NeoX). Unfused, PyTorch
(and a fusion of the elementwise ops alone) runs it as a negation, a concatenation copy and a
multiply-add, three launches that each read and write the tensor. One program here owns BLOCK_R rows
and reads each row's two halves once:

    out[:D/2] = x1 * cos[:D/2] - x2 * sin[:D/2]
    out[D/2:] = x2 * cos[D/2:] + x1 * sin[D/2:]

``x`` is any 4-D strided view (the head-split view of a QKV projection, or a slice of it when only
part of the head dim rotates); ``cos`` and ``sin`` are read through broadcast strides (stride 0 over
the batch or head dims), so nothing is materialised. Arithmetic is fp32; the output is contiguous.

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
def _rotary_fwd(
    X, C, S, Out,
    R1, R2, n_rows, HALF, N_PASS,
    sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, INTERLEAVED: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
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
    x1 = tl.load(X + xr + lo * sx3, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + xr + hi * sx3, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(C + cr + lo * sc3, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(C + cr + hi * sc3, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(S + sr + lo * ss3, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(S + sr + hi * ss3, mask=mask, other=0.0).to(tl.float32)
    out = Out + rows[:, None] * (2 * HALF + N_PASS)
    tl.store(out + lo, (x1 * c1 - x2 * s1).to(Out.dtype.element_ty), mask=mask)
    tl.store(out + hi, (x2 * c2 + x1 * s2).to(Out.dtype.element_ty), mask=mask)
    if BLOCK_P > 0:  # partial rotary: the columns past the rotated ones are copied (the model's cat)
        pc = (2 * HALF + tl.arange(0, BLOCK_P))[None, :]
        pm = (rows < n_rows)[:, None] & (pc < 2 * HALF + N_PASS)
        tl.store(out + pc, tl.load(X + xr + pc * sx3, mask=pm, other=0.0).to(Out.dtype.element_ty), mask=pm)


def _as_4d(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``t`` broadcast to the 4-D ``shape`` (a view: stride 0 on broadcast dims)."""
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t
    return t.expand(shape)


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
    writes the contiguous ``out``. ``block_r`` (rows a program) and ``num_warps`` override ``launch_config``.
    ``rotary_dims``: only the first ``rotary_dims`` columns rotate (``cos``/``sin`` have that width), the
    rest are copied: ``cat([rotary(x[..., :r]), x[..., r:]], -1)`` (GPT-NeoX, Phi) in one pass.
    ``interleaved``: ``rotate_every_two`` (GPT-J), pairing columns 2i and 2i + 1."""
    rd = x.shape[-1] if rotary_dims is None else rotary_dims
    if x.dim() > 4 or x.dim() < 1 or rd % 2 or not 0 < rd <= x.shape[-1]:
        raise ValueError(f"rotary: x must have rank 1-4 and an even number of rotated dims, got shape {tuple(x.shape)}, {rd} rotated")
    shape = x.shape
    x4 = _as_4d(x, torch.Size((1,) * (4 - x.dim()) + tuple(shape)))
    try:
        c4, s4 = _as_4d(cos, x4.shape[:-1] + (rd,)), _as_4d(sin, x4.shape[:-1] + (rd,))
    except RuntimeError:
        raise ValueError(f"rotary: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} do not broadcast to x {tuple(shape)}") from None
    o = out if out is not None else torch.empty(shape, dtype=dtype or x.dtype, device=x.device)
    if not o.is_contiguous() or o.shape != shape:
        raise ValueError("rotary: out must be contiguous and of x's shape")
    r0, r1, r2, d = x4.shape
    n_rows = r0 * r1 * r2
    if n_rows == 0 or d == 0:
        return o
    half, n_pass = rd // 2, d - rd
    block_h = max(16, triton.next_power_of_2(half))
    block_p = triton.next_power_of_2(n_pass) if n_pass else 0
    auto_r, auto_w = launch_config(n_rows, block_h, num_sms(x.device, 132))
    block_r, num_warps = block_r or auto_r, num_warps or auto_w
    grid = (triton.cdiv(n_rows, block_r),)
    _rotary_fwd[grid](
        x4, c4, s4, o, r1, r2, n_rows, half, n_pass, *x4.stride(), *c4.stride(), *s4.stride(),
        BLOCK_R=block_r, BLOCK_H=block_h, BLOCK_P=block_p, INTERLEAVED=interleaved, num_warps=num_warps, **pdl.launch_kwargs(),
    )  # fmt: skip
    return o


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
