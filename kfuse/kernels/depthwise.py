"""Depthwise convolution (``groups == in_channels == out_channels``) on channels-last tensors, with bias.

ConvNeXt-T runs 18 depthwise 7x7 convs (96-768 channels); in session 36 they were PyTorch fallbacks and
ConvNeXt-T B32 compiled was 0.79x of eager in a CUDA graph. A depthwise conv is memory-bound (49 FMAs per
output element): one program owns a [pixels, channels] tile (``kfuse.kernels.nhwc_window``, as the max pool). The floor at
ConvNeXt-T's first stage (B32, 56 x 56 x 96 fp16): read + write 2 x 19.3 MB = 9 us at 4.3 TB/s. Like every
kfuse kernel that has a PyTorch twin, the lowering times both on the GPU and keeps the faster.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.ir.ops import CONV_ACTIVATIONS
from kfuse.kernels import pdl
from kfuse.kernels.codegen import as_pair, interpreting
from kfuse.kernels.nhwc_window import out_size, output_like, tile
from kfuse.kernels.pdl import pdl_start


@triton.jit
def _activation(acc, ACT: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr):
    """The conv's absorbed activation (``passes.fuse_conv_activation``); NaN stays NaN, as in PyTorch."""
    if ACT == "clamp":
        if LO is not None:
            acc = tl.maximum(acc, LO, propagate_nan=tl.PropagateNan.ALL)
        if HI is not None:
            acc = tl.minimum(acc, HI, propagate_nan=tl.PropagateNan.ALL)
    elif ACT == "silu":
        acc = acc / (1.0 + tl.exp(-acc))
    elif ACT == "hardswish":  # x * relu6(x + 3) / 6 (MobileNet-V3)
        acc = acc * tl.minimum(tl.maximum(acc + 3.0, 0.0, propagate_nan=tl.PropagateNan.ALL), 6.0, propagate_nan=tl.PropagateNan.ALL) / 6.0
    elif ACT == "hardsigmoid":
        acc = tl.minimum(tl.maximum(acc + 3.0, 0.0, propagate_nan=tl.PropagateNan.ALL), 6.0, propagate_nan=tl.PropagateNan.ALL) / 6.0
    elif ACT == "gelu":  # exact GELU with erfc from Abramowitz & Stegun 7.1.26, as kfuse's GEMM epilogues
        t = 1.0 / (1.0 + 0.3275911 * tl.abs(acc * 0.7071067811865476))
        erfc = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        erfc = erfc * tl.exp(-0.5 * acc * acc)
        acc = acc * tl.where(acc >= 0.0, 1.0 - 0.5 * erfc, 0.5 * erfc)
    return acc


@triton.jit
def _depthwise_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, C, H, W, OH, OW, n_rows,
    sxn, sxc, sxh, sxw, syn, syc, syh, syw,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
    ACT: tl.constexpr = "", LO: tl.constexpr = None, HI: tl.constexpr = None,
):  # fmt: skip
    pdl_start(PDL)
    offs_c, mask_p, mask_c, n, oh, ow = tile(N, C, OH, OW, BLOCK_P, BLOCK_C)
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for kh in range(0, n_rows):  # a rolled loop (a runtime bound): unrolled, the 49 taps' loads were all
        for kw in tl.static_range(KW):  # hoisted (255 registers, spills, two programs an SM)
            ih = oh * SH - PH + kh * DH
            iw = ow * SW - PW + kw * DW
            ok = mask_p & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            ptrs = x_ptr + (n * sxn + ih * sxh + iw * sxw)[:, None] + offs_c[None, :] * sxc
            v = tl.load(ptrs, mask=ok[:, None] & mask_c[None, :], other=0.0)
            wt = tl.load(w_ptr + offs_c * (KH * KW) + (kh * KW + kw), mask=mask_c, other=0.0)  # weight (C, 1, KH, KW)
            acc += v.to(tl.float32) * wt.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)[None, :]
    acc = _activation(acc, ACT, LO, HI)
    y_ptrs = y_ptr + (n * syn + oh * syh + ow * syw)[:, None] + offs_c[None, :] * syc
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_p[:, None] & mask_c[None, :])


@triton.jit
def _depthwise_nhwc_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, n_rows,
    C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, EVEN_C: tl.constexpr, PDL: tl.constexpr,
    ACT: tl.constexpr = "", LO: tl.constexpr = None, HI: tl.constexpr = None,
):  # fmt: skip
    """The same conv on dense channels-last tensors, with every size but the batch a constant: a tap's
    offset from the pixel's first tap, (kh * DH * W + kw * DW) * C, is then a constant the load takes as
    an immediate (one pointer add per kernel row, not one per element and tap), the divisions that decode
    a pixel are multiplications, and with C a multiple of BLOCK_C the loads carry no channel mask."""
    pdl_start(PDL)
    offs_c, mask_p, mask_c, n, oh, ow = tile(N, C, OH, OW, BLOCK_P, BLOCK_C)
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    first = x_ptr + (n * (H * W * C) + ih0 * (W * C) + iw0 * C)[:, None] + offs_c[None, :]
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for kh in range(0, n_rows):  # rolled, as in _depthwise_kernel
        ih = ih0 + kh * DH
        row_ok = mask_p & (ih >= 0) & (ih < H)
        row = first + kh * (DH * W * C)
        for kw in tl.static_range(KW):
            iw = iw0 + kw * DW
            ok = row_ok & (iw >= 0) & (iw < W)
            m = ok[:, None] if EVEN_C else ok[:, None] & mask_c[None, :]
            v = tl.load(row + kw * (DW * C), mask=m, other=0.0)
            wt = tl.load(w_ptr + offs_c * (KH * KW) + (kh * KW + kw), mask=mask_c, other=0.0)
            acc += v.to(tl.float32) * wt.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)[None, :]
    acc = _activation(acc, ACT, LO, HI)
    y_ptrs = y_ptr + (n * (OH * OW * C) + oh * (OW * C) + ow * C)[:, None] + offs_c[None, :]
    ym = mask_p[:, None] if EVEN_C else mask_p[:, None] & mask_c[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=ym)


@triton.jit
def _rows_fma(v, acc, wk, J: tl.constexpr, KW: tl.constexpr, KH: tl.constexpr, C: tl.constexpr, mask_c, EVEN_C: tl.constexpr):
    """acc (pending output row J of the ring) += v x its tap: row J takes kernel row KH - 1 - J."""
    if J < KH:
        ptr = wk + (KH - 1 - J) * (KW * C)
        wt = tl.load(ptr) if EVEN_C else tl.load(ptr, mask=mask_c, other=0.0)
        acc += v * wt[None, :]
    return acc


@triton.jit
def _rows_next(acc_next, J: tl.constexpr, KH: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """Ring slot J after a step: the next slot's partial row, or a new (zero) row for the last slot."""
    if J + 1 < KH:
        return acc_next
    return tl.zeros((BLOCK_W, BLOCK_C), tl.float32)


@triton.jit
def _rows_tap(first_tap, ih, ow, KWI: tl.constexpr, KW: tl.constexpr, PW: tl.constexpr, H: tl.constexpr, W: tl.constexpr,
              C: tl.constexpr, mask_c, EVEN_C: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    """Input row ih at kernel column KWI, in the input's dtype (zeros past the kernel's width or the image)."""
    if KWI < KW:
        iw = ow - PW + KWI
        ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        m = ok[:, None] if EVEN_C else ok[:, None] & mask_c[None, :]
        return tl.load(first_tap + ih * (W * C) + KWI * C, mask=m, other=0.0)
    return tl.zeros((BLOCK_W, BLOCK_C), first_tap.dtype.element_ty)


@triton.jit
def _rows_tap_fmas(v, KWI: tl.constexpr, a0, a1, a2, a3, a4, a5, a6, wk, KW: tl.constexpr, KH: tl.constexpr, C: tl.constexpr,
                   mask_c, EVEN_C: tl.constexpr):  # fmt: skip
    """One input row's kernel column KWI into every ring slot it reaches."""
    if KWI < KW:
        vf = v.to(tl.float32)
        wc = wk + KWI * C
        a0 = _rows_fma(vf, a0, wc, 0, KW, KH, C, mask_c, EVEN_C)
        a1 = _rows_fma(vf, a1, wc, 1, KW, KH, C, mask_c, EVEN_C)
        a2 = _rows_fma(vf, a2, wc, 2, KW, KH, C, mask_c, EVEN_C)
        a3 = _rows_fma(vf, a3, wc, 3, KW, KH, C, mask_c, EVEN_C)
        a4 = _rows_fma(vf, a4, wc, 4, KW, KH, C, mask_c, EVEN_C)
        a5 = _rows_fma(vf, a5, wc, 5, KW, KH, C, mask_c, EVEN_C)
        a6 = _rows_fma(vf, a6, wc, 6, KW, KH, C, mask_c, EVEN_C)
    return a0, a1, a2, a3, a4, a5, a6


@triton.jit
def _depthwise_rows_kernel(
    x_ptr, wp_ptr, b_ptr, y_ptr,
    C: tl.constexpr, H: tl.constexpr, W: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr,
    KH: tl.constexpr, KW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr, EVEN_C: tl.constexpr,
    PDL: tl.constexpr, ACT: tl.constexpr = "", LO: tl.constexpr = None, HI: tl.constexpr = None,
):  # fmt: skip
    """Stride 1, dilation 1, KH <= 7, dense channels-last: each input row is loaded and converted once per
    program, not KH times. A program walks ROWS output rows of one image down a strip of BLOCK_W columns
    x BLOCK_C channels, holding the KH output rows an input row contributes to (a ring a0..a6: a_j takes
    kernel row KH - 1 - j); after each input row a0 is complete, is stored, and the ring shifts. Per
    output: KW loads and conversions instead of KH x KW (7 instead of 49 at 7x7), the same KH x KW FMAs.
    The weight is packed (KH, KW, C) fp32 (``pack_rows_weight``) so a tap's channels are one vector load."""
    pdl_start(PDL)
    CHUNKS: tl.constexpr = (OH + ROWS - 1) // ROWS
    pid = tl.program_id(0)
    n = (pid // CHUNKS).to(tl.int64)
    oh0 = (pid % CHUNKS) * ROWS
    ow = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_w = ow < OW
    mask_c = offs_c < C
    first_tap = x_ptr + n * (H * W * C) + ((ow - PW) * C)[:, None] + offs_c[None, :]
    y_row = y_ptr + n * (OH * OW * C) + (ow * C)[:, None] + offs_c[None, :]
    bias = tl.load(b_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32) if HAS_BIAS else None
    a0 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)
    a1 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)
    a2 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)
    a3 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)
    a4 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)
    a5 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)
    a6 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)
    # the next input row's taps are loaded before this row's FMAs (a software pipeline by hand: Triton
    # pipelines only loads that feed tl.dot; without it every step waited on L2, session 38's first probe)
    v0 = _rows_tap(first_tap, oh0 - PH, ow, 0, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
    v1 = _rows_tap(first_tap, oh0 - PH, ow, 1, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
    v2 = _rows_tap(first_tap, oh0 - PH, ow, 2, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
    v3 = _rows_tap(first_tap, oh0 - PH, ow, 3, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
    v4 = _rows_tap(first_tap, oh0 - PH, ow, 4, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
    v5 = _rows_tap(first_tap, oh0 - PH, ow, 5, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
    v6 = _rows_tap(first_tap, oh0 - PH, ow, 6, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
    wk = wp_ptr + offs_c
    for i in range(0, ROWS + KH - 1):
        ih = oh0 - PH + i + 1
        n0 = _rows_tap(first_tap, ih, ow, 0, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
        n1 = _rows_tap(first_tap, ih, ow, 1, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
        n2 = _rows_tap(first_tap, ih, ow, 2, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
        n3 = _rows_tap(first_tap, ih, ow, 3, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
        n4 = _rows_tap(first_tap, ih, ow, 4, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
        n5 = _rows_tap(first_tap, ih, ow, 5, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
        n6 = _rows_tap(first_tap, ih, ow, 6, KW, PW, H, W, C, mask_c, EVEN_C, BLOCK_W, BLOCK_C)
        a0, a1, a2, a3, a4, a5, a6 = _rows_tap_fmas(v0, 0, a0, a1, a2, a3, a4, a5, a6, wk, KW, KH, C, mask_c, EVEN_C)
        a0, a1, a2, a3, a4, a5, a6 = _rows_tap_fmas(v1, 1, a0, a1, a2, a3, a4, a5, a6, wk, KW, KH, C, mask_c, EVEN_C)
        a0, a1, a2, a3, a4, a5, a6 = _rows_tap_fmas(v2, 2, a0, a1, a2, a3, a4, a5, a6, wk, KW, KH, C, mask_c, EVEN_C)
        a0, a1, a2, a3, a4, a5, a6 = _rows_tap_fmas(v3, 3, a0, a1, a2, a3, a4, a5, a6, wk, KW, KH, C, mask_c, EVEN_C)
        a0, a1, a2, a3, a4, a5, a6 = _rows_tap_fmas(v4, 4, a0, a1, a2, a3, a4, a5, a6, wk, KW, KH, C, mask_c, EVEN_C)
        a0, a1, a2, a3, a4, a5, a6 = _rows_tap_fmas(v5, 5, a0, a1, a2, a3, a4, a5, a6, wk, KW, KH, C, mask_c, EVEN_C)
        a0, a1, a2, a3, a4, a5, a6 = _rows_tap_fmas(v6, 6, a0, a1, a2, a3, a4, a5, a6, wk, KW, KH, C, mask_c, EVEN_C)
        v0, v1, v2, v3, v4, v5, v6 = n0, n1, n2, n3, n4, n5, n6
        oh = oh0 + i - (KH - 1)  # a0's row; rows above oh0 belong to the previous chunk's program
        out = a0
        if HAS_BIAS:
            out += bias[None, :]
        out = _activation(out, ACT, LO, HI)
        keep = mask_w & (oh >= oh0) & (oh < OH)
        ym = keep[:, None] if EVEN_C else keep[:, None] & mask_c[None, :]
        tl.store(y_row + oh * (OW * C), out.to(y_ptr.dtype.element_ty), mask=ym)
        a0 = _rows_next(a1, 0, KH, BLOCK_W, BLOCK_C)
        a1 = _rows_next(a2, 1, KH, BLOCK_W, BLOCK_C)
        a2 = _rows_next(a3, 2, KH, BLOCK_W, BLOCK_C)
        a3 = _rows_next(a4, 3, KH, BLOCK_W, BLOCK_C)
        a4 = _rows_next(a5, 4, KH, BLOCK_W, BLOCK_C)
        a5 = _rows_next(a6, 5, KH, BLOCK_W, BLOCK_C)
        a6 = tl.zeros((BLOCK_W, BLOCK_C), tl.float32)


MAX_RING_ROWS = 7  # _depthwise_rows_kernel's ring: a0..a6


def rows_kernel_takes(stride: tuple[int, int], dilation: tuple[int, int], kh: int) -> bool:
    """The rows kernel's geometry: stride 1, dilation 1, at most ``MAX_RING_ROWS`` kernel rows (its tensors must
    also be dense channels-last, which only the call can tell)."""
    return tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and kh <= MAX_RING_ROWS


def pack_rows_weight(weight: torch.Tensor) -> torch.Tensor:
    """A depthwise weight (C, 1, KH, KW) as the rows kernel reads it: (KH, KW, C) fp32, contiguous."""
    return weight[:, 0].permute(1, 2, 0).to(torch.float32).contiguous()


def use_rows(kh: int, kw: int, out_h: int) -> bool:
    """Whether "auto" takes the rows kernel for an eligible conv. Measured (``depthwise_probe.py``, session 38,
    before the rows kernel's prefetch): it won only at MobileNet-V2's 3x3 on 112 x 112 x 32 (26.0 us against
    the taps kernel's 31.7 and cuDNN's 56.5); at 7x7 and 5x5 the taps kernel was 1.2-3x faster (a rows program
    walks 20 input rows one after another and waited on each). A compiled model times both (and PyTorch)."""
    return kh * kw <= 9 and out_h >= 96


def may_use_rows(kh: int, kw: int, out_h: int) -> bool:
    """Whether a compile should time the rows kernel at all: at 3x3 on images of 56 rows or more it was
    within 10% of the best or the best (session 38's two probes; 112 x 112 x 32: 29.6 us vs the taps kernel's
    31.1, 56 x 56 x 144: 39.3 vs 44.2); at 5x5 and 7x7 it lost everywhere (1.2-6x). Every candidate is one
    more Triton compile per conv shape (EfficientNet-B0's compile took 158 s with both for every layer, 52 s
    before)."""
    return kh * kw <= 9 and out_h >= 56


def rows_config(width: int, channels: int, height: int) -> tuple[int, int, int, int]:
    """(BLOCK_W, BLOCK_C, ROWS, num_warps) for the rows kernel: 16 x 32 with 2 warps (8 fp32 values a thread
    and ring slot, 144 registers, no spills) and 28 rows a program won both layers it won (session 38's
    second probe: 112 x 112 x 32 29.6 us vs 32.8 with 14 rows; 56 x 56 x 144 39.3 vs 48.2)."""
    if interpreting():
        return 8, 16, 4, 4
    return min(16, triton.next_power_of_2(width)), min(32, triton.next_power_of_2(channels)), min(28, height), 2


def launch_config(channels: int, in_h: int = 0, taps: int = 49) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_C, num_warps) of the taps kernels. Registers bound them: a thread holds its share of the
    fp32 tile and of the KW loads of one kernel row in flight (the fully unrolled 49 taps took 255 registers and
    spilled). 64 pixels x 32 channels with 2 warps was within 4% of the best of 24 tiles at each of MobileNet-V2's
    3x3 layers on the H200 (session 37, the general kernel). Session 38 timed the dense channels-last kernel
    (``benchmarks/experiments/depthwise_probe.py``): with this tile it beats cuDNN + bias at every 7x7 layer of
    ConvNeXt-T (stage 1 83.7 us vs 91.2; the general kernel took 115.7) and every 5x5 one of EfficientNet-B0,
    within 0-15% of the best of four tiles. On 112-row images at 3x3 half the pixels a program (32) was better:
    MobileNet-V2's 112 x 112 x 32 31.4 us vs 38.7, its stride-2 112 x 112 x 96 40.4 vs 55.8."""
    if interpreting():
        return 16, 16, 4
    block_p = 32 if taps <= 9 and in_h >= 112 else 64
    return block_p, min(32, triton.next_power_of_2(channels)), 2


def auto_kernel(channels: int, in_h: int, out_h: int, out_w: int, kh: int, kw: int, rows_ok: bool) -> tuple[str, tuple[int, ...]]:
    """What ``kernel="auto"`` runs, with its tile: the rows kernel where it can run and ``use_rows`` says so,
    else the taps kernel."""
    if rows_ok and use_rows(kh, kw, out_h):
        return "rows", rows_config(out_w, channels, out_h)
    return "taps", launch_config(channels, in_h, kh * kw)


def _const(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


def is_depthwise(weight_shape: tuple[int, ...], in_channels: int, groups: int) -> bool:
    """A conv this kernel runs: one filter per input channel (``groups == C_in == C_out``), 2-D."""
    return len(weight_shape) == 4 and groups == in_channels and weight_shape[0] == in_channels and weight_shape[1] == 1


def depthwise_conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: object = 1, padding: object = 0, dilation: object = 1,
    out: torch.Tensor | None = None, config: tuple[int, ...] | None = None, act: tuple | None = None,
    kernel: str = "auto", packed_weight: torch.Tensor | None = None, pad_end: tuple[int, int] = (0, 0),
) -> torch.Tensor:  # fmt: skip
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups=C)`` for a depthwise ``weight`` (C, 1, KH, KW);
    any memory format in, the input's format out (channels-last in, channels-last out). ``act``: None,
    ("clamp", lo, hi), ("silu",), ("gelu",), ("hardswish",) or ("hardsigmoid",), applied before the store.
    ``kernel``: "rows" (the row-ring kernel: dense channels-last, stride 1, dilation 1, KH <= 7), "taps" (one
    program a pixel tile, every tap loaded), or "auto" (``use_rows``). ``config``: the kernel's tile, (BLOCK_W,
    BLOCK_C, ROWS, num_warps) for "rows", (BLOCK_P, BLOCK_C, num_warps) for "taps"; else ``rows_config`` /
    ``launch_config``. ``packed_weight``: ``pack_rows_weight(weight)``, computed once by a caller whose weight is a
    constant. ``pad_end``: more zero padding past the bottom / right (a folded asymmetric pad, TF "same"): a larger
    output, read as zeros ("taps")."""
    if x.dim() != 4 or not is_depthwise(tuple(weight.shape), x.shape[1], x.shape[1]):
        raise ValueError(f"depthwise_conv2d: x {tuple(x.shape)} and weight {tuple(weight.shape)} are not a depthwise conv")
    if bias is not None and tuple(bias.shape) != (x.shape[1],):
        raise ValueError(f"depthwise_conv2d: bias has shape {tuple(bias.shape)}, expected ({x.shape[1]},)")
    (sh, sw), (ph, pw), (dh, dw) = as_pair(stride, 1), as_pair(padding, 0), as_pair(dilation, 1)
    nb, c, h, w = x.shape
    kh, kw = weight.shape[2], weight.shape[3]
    oh, ow = max(out_size(h + pad_end[0], kh, sh, ph, dh), 0), max(out_size(w + pad_end[1], kw, sw, pw, dw), 0)
    out = output_like(x, (nb, c, oh, ow), out, "depthwise_conv2d")
    if out.numel() == 0:
        return out
    if act is not None and act[0] not in CONV_ACTIVATIONS:
        raise ValueError(f"depthwise_conv2d: unknown activation {act!r}")
    acts = {"ACT": act[0] if act else ""}
    if act and act[0] == "clamp":
        acts.update(LO=_const(act[1]), HI=_const(act[2]))
    dense = x.is_contiguous(memory_format=torch.channels_last) and out.is_contiguous(memory_format=torch.channels_last)
    rows_ok = dense and c > 1 and rows_kernel_takes((sh, sw), (dh, dw), kh) and not any(pad_end)
    if kernel == "rows" and not rows_ok:
        raise ValueError("depthwise_conv2d: the rows kernel takes dense channels-last tensors, stride 1, dilation 1, KH <= 7")
    if kernel not in ("auto", "rows", "taps"):
        raise ValueError(f"depthwise_conv2d: kernel must be 'auto', 'rows' or 'taps', not {kernel!r}")
    if kernel == "auto":
        kernel, tile_cfg = auto_kernel(c, h, oh, ow, kh, kw, rows_ok)
    else:
        tile_cfg = rows_config(ow, c, oh) if kernel == "rows" else launch_config(c, h, kh * kw)
    if kernel == "rows":
        wp = packed_weight if packed_weight is not None else pack_rows_weight(weight)
        block_w, block_c, rows, warps = config or tile_cfg
        grid = (nb * triton.cdiv(oh, rows), triton.cdiv(ow, block_w), triton.cdiv(c, block_c))
        _depthwise_rows_kernel[grid](
            x, wp, bias if bias is not None else wp, out, C=c, H=h, W=w, OH=oh, OW=ow, KH=kh, KW=kw, PH=ph, PW=pw,
            HAS_BIAS=bias is not None, BLOCK_W=block_w, BLOCK_C=block_c, ROWS=rows, EVEN_C=c % block_c == 0,
            num_warps=warps, **acts, **pdl.launch_kwargs(),
        )  # fmt: skip
        return out
    wc = weight.contiguous()
    block_p, block_c, warps = config or tile_cfg
    grid = (triton.cdiv(nb * oh * ow, block_p), triton.cdiv(c, block_c))
    if dense and c > 1:  # (a 1-channel tensor is channels-last and contiguous alike: the general kernel)
        _depthwise_nhwc_kernel[grid](
            x, wc, bias if bias is not None else wc, out, nb, kh, C=c, H=h, W=w, OH=oh, OW=ow,
            KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, HAS_BIAS=bias is not None,
            BLOCK_P=block_p, BLOCK_C=block_c, EVEN_C=c % block_c == 0, num_warps=warps, **acts, **pdl.launch_kwargs(),
        )  # fmt: skip
        return out
    _depthwise_kernel[grid](
        x, wc, bias if bias is not None else wc, out, nb, c, h, w, oh, ow, kh, *x.stride(), *out.stride(),
        KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, HAS_BIAS=bias is not None,
        BLOCK_P=block_p, BLOCK_C=block_c, num_warps=warps, **acts, **pdl.launch_kwargs(),
    )  # fmt: skip
    return out
