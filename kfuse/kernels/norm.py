"""LayerNorm / RMSNorm template with fused residual adds: ``norm(x + a1 + a2 ...) * w + b``.

One program normalises ROWS rows of N features held in registers (fp32 statistics). Up to three
addends are summed into the row first (bias, residual, position embeddings, ...): an addend
broadcast over the leading dims (``[1, S, N]`` against ``[B, S, N]``, or ``[N]``) is read with
``row % period`` so nothing is materialised. This is ByteTransformer's fused add-bias + residual +
LayerNorm; in kfuse the bias and residual usually already sit in the GEMM epilogue, so the usual
form is the plain LayerNorm of one GEMM output (one read, one write).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kfuse.kernels import pdl
from kfuse.kernels.codegen import interpreting, num_sms
from kfuse.kernels.pdl import pdl_start

MAX_ADDENDS = 3


@triton.jit
def _norm_fwd(
    X, A0, A1, A2, W, Bias, Y, Index, R,
    M, N, stride_x, stride_a0, stride_a1, stride_a2, stride_y, stride_r, per0, per1, per2,
    eps,
    N_ADD: tl.constexpr, RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, GATHER: tl.constexpr,
    POST: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    src = rows
    if GATHER:  # output row r normalises source row Index[r] (a row reordering folded in)
        src = tl.load(Index + rows, mask=row_ok, other=0)
    x = tl.load(X + src[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if N_ADD >= 1:
        x += tl.load(A0 + (src % per0)[:, None] * stride_a0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if N_ADD >= 2:
        x += tl.load(A1 + (src % per1)[:, None] * stride_a1 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if N_ADD >= 3:
        x += tl.load(A2 + (src % per2)[:, None] * stride_a2 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if RMS:
        var = tl.sum(x * x, 1) / N
        xhat = x * tl.rsqrt(var + eps)[:, None]
    else:
        mean = tl.sum(x, 1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        var = tl.sum(xc * xc, 1) / N
        xhat = xc * tl.rsqrt(var + eps)[:, None]
    if HAS_W:
        xhat = xhat * tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        xhat = xhat + tl.load(Bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if POST:  # a post-norm residual (Swin-V2: x + LayerNorm(f(x))), added before the one rounding
        xhat = xhat + tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], xhat.to(Y.dtype.element_ty), mask=mask)


def rows2d(t: torch.Tensor, n: int, what: str) -> tuple[torch.Tensor, int]:
    """A ``[rows, n]`` view of ``t`` with a contiguous feature dim, and its row stride."""
    if t.shape[-1] != n:
        raise ValueError(f"norm: {what} has last dim {t.shape[-1]}, expected {n}")
    if t.stride(-1) != 1:
        t = t.contiguous()
    try:
        t2 = t.view(-1, n)
    except RuntimeError:
        t2 = t.reshape(-1, n)
    return t2, (t2.stride(0) if t2.shape[0] > 1 else n)


def _vector(t: torch.Tensor | None, n: int, what: str) -> torch.Tensor | None:
    """``weight`` / ``bias``: the kernel reads ``t[col]`` at ``t + col``, so a contiguous ``[n]``."""
    if t is None:
        return None
    if tuple(t.shape) != (n,):
        raise ValueError(f"norm: {what} has shape {tuple(t.shape)}, expected ({n},)")
    return t.contiguous()


def _period(a: torch.Tensor, out_shape: tuple[int, ...]) -> int:
    """Rows of ``a`` that repeat over the output rows; ``a`` may only be broadcast over leading dims."""
    shape = (1,) * (len(out_shape) - a.dim()) + tuple(a.shape)
    lead = 0
    while lead < len(shape) - 1 and shape[lead] == 1 and out_shape[lead] != 1:
        lead += 1
    if tuple(shape[lead:]) != tuple(out_shape[lead:]):
        raise ValueError(f"norm: addend of shape {tuple(a.shape)} is not a leading-dim broadcast of {tuple(out_shape)}")
    period = 1
    for s in shape[lead:-1]:
        period *= s
    return max(period, 1)


def launch_config(m: int, block_n: int, sms: int = 132) -> tuple[int, int]:
    """(rows a program, warps) for ``m`` rows of ``block_n`` (padded) columns. Up to 4096 elements a
    program, but a norm is latency-bound when its grid is short: fewer rows a program until every SM
    has two programs (OPT-125m's 512 x 768: 4 rows = 128 programs on 132 SMs took 7.8 us against
    PyTorch's 3.8), and no fewer than 8 elements a thread (one 16-byte fp16 vector)."""
    if interpreting():
        return 4, 1
    rows = max(1, min(16, 4096 // block_n))
    while rows > 1 and -(-m // rows) < 2 * sms:
        rows //= 2
    warps = 4 if block_n * rows <= 4096 else 8
    return rows, max(1, min(warps, block_n * rows // 256))


def norm(
    x: torch.Tensor,
    addends: Sequence[torch.Tensor] = (),
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float = 1e-5,
    rms: bool = False,
    out: torch.Tensor | None = None,
    rows: int | None = None,
    num_warps: int | None = None,
    row_index: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``layer_norm(x + sum(addends)) * weight + bias`` (or RMSNorm with ``rms=True``) over the last dim.
    ``rows`` (rows a program, a power of two) and ``num_warps`` override ``launch_config``'s choice.
    ``row_index`` (1-D int): output row ``r`` is the norm of source row ``row_index[r]``, the result
    ``[len(row_index), N]``. ``residual`` (the output's shape): added to the result in fp32, one rounding."""
    if len(addends) > MAX_ADDENDS:
        raise ValueError(f"norm: at most {MAX_ADDENDS} addends, got {len(addends)}")
    n = x.shape[-1]
    x2, sx = rows2d(x, n, "input")
    src_m = x2.shape[0]
    if row_index is not None and (row_index.dim() != 1 or row_index.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"norm: row_index must be a 1-D int32/int64 tensor, got {row_index.dtype} of rank {row_index.dim()}")
    out_shape = tuple(x.shape) if row_index is None else (row_index.numel(), n)
    m = src_m if row_index is None else row_index.numel()
    if out is not None and (tuple(out.shape) != out_shape or out.device != x.device):
        raise ValueError(f"norm: out is {tuple(out.shape)} on {out.device}, expected {out_shape} on {x.device}")
    y = out if out is not None else torch.empty(out_shape, dtype=x.dtype, device=x.device)
    y2, sy = rows2d(y, n, "output")
    if m == 0:
        return y
    if y2.data_ptr() != y.data_ptr():  # rows2d copied: the kernel would write a temporary, not ``out``
        raise ValueError(f"norm: out (strides {tuple(y.stride())}) must have a unit-stride last dim and rows of one stride")
    adds, strides, periods = [], [], []
    for j, a in enumerate(addends):
        per = _period(a, tuple(x.shape))
        a2, sa = rows2d(a.reshape(per, n) if a.numel() == per * n else a, n, f"addend {j}")
        adds.append(a2)
        strides.append(sa)
        periods.append(per if per < src_m else src_m)
    while len(adds) < MAX_ADDENDS:
        adds.append(x2)
        strides.append(0)
        periods.append(1)
    r2, sr = x2, 0
    if residual is not None:
        if residual.numel() != m * n or residual.shape[-1] != n:
            raise ValueError(f"norm: residual of shape {tuple(residual.shape)} does not match the output {out_shape}")
        r2, sr = rows2d(residual, n, "residual")
    weight, bias = _vector(weight, n, "weight"), _vector(bias, n, "bias")
    block_n = triton.next_power_of_2(n)
    auto_rows, auto_warps = launch_config(m, block_n, num_sms(x.device, 132))
    rows, warps = rows or auto_rows, num_warps or auto_warps
    _norm_fwd[(triton.cdiv(m, rows),)](
        x2, adds[0], adds[1], adds[2],
        weight if weight is not None else x2, bias if bias is not None else x2, y2,
        row_index if row_index is not None else x2, r2,
        m, n, sx, strides[0], strides[1], strides[2], sy, sr, periods[0], periods[1], periods[2],
        float(eps),
        N_ADD=len(addends), RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None,
        GATHER=row_index is not None, POST=residual is not None,
        ROWS=rows, BLOCK_N=block_n, num_warps=warps, **pdl.launch_kwargs(),
    )  # fmt: skip
    return y


def reference(
    x: torch.Tensor,
    addends: Sequence[torch.Tensor] = (),
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float = 1e-5,
    rms: bool = False,
) -> torch.Tensor:
    """The oracle in float32."""
    s = x.float()
    for a in addends:
        s = s + a.float()
    n = (x.shape[-1],)
    w = weight.float() if weight is not None else None
    if rms:
        return torch.nn.functional.rms_norm(s, n, w, eps)
    return torch.nn.functional.layer_norm(s, n, w, bias.float() if bias is not None else None, eps)
