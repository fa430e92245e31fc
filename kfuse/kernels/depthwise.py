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


def launch_config(channels: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_C, num_warps). Registers bound this kernel: a thread holds its share of the fp32
    tile and of the KW loads of one kernel row in flight (ptxas, sm_90: 32 x 128 with 4 warps 206 registers,
    16 x 128 145, 32 x 64 113; the fully unrolled 49 taps took 255 and spilled). 64 pixels x 32 channels
    with 2 warps was within 4% of the best of 24 tiles at each of MobileNet-V2's 3x3 layers on the H200
    (``benchmarks/experiments/depthwise_probe.py``, session 37), 1.2-2.5x faster than cuDNN there; at
    ConvNeXt's 7x7 layers no tile beat cuDNN (49 loads an output, L1/L2-bound), and the compiler keeps
    PyTorch's there by measurement. The probe timed ``_depthwise_kernel``; the dense channels-last kernel
    (what a compiled model runs) takes ~25% fewer SASS instructions and 100-131 registers instead of
    149-210 at the same tiles (offline, sm_90), not yet timed."""
    if interpreting():
        return 16, 16, 4
    return 64, min(32, triton.next_power_of_2(channels)), 2


def _const(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


def is_depthwise(weight_shape: tuple[int, ...], in_channels: int, groups: int) -> bool:
    """A conv this kernel runs: one filter per input channel (``groups == C_in == C_out``), 2-D."""
    return len(weight_shape) == 4 and groups == in_channels and weight_shape[0] == in_channels and weight_shape[1] == 1


def depthwise_conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: object = 1, padding: object = 0, dilation: object = 1,
    out: torch.Tensor | None = None, config: tuple[int, int, int] | None = None, act: tuple | None = None,
) -> torch.Tensor:  # fmt: skip
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups=C)`` for a depthwise ``weight`` (C, 1, KH, KW);
    any memory format in, the input's format out (channels-last in, channels-last out). ``config``:
    (BLOCK_P, BLOCK_C, num_warps), else ``launch_config``'s. ``act``: None, ("clamp", lo, hi), ("silu",) or ("gelu",),
    applied before the store."""
    if x.dim() != 4 or not is_depthwise(tuple(weight.shape), x.shape[1], x.shape[1]):
        raise ValueError(f"depthwise_conv2d: x {tuple(x.shape)} and weight {tuple(weight.shape)} are not a depthwise conv")
    if bias is not None and tuple(bias.shape) != (x.shape[1],):
        raise ValueError(f"depthwise_conv2d: bias has shape {tuple(bias.shape)}, expected ({x.shape[1]},)")
    (sh, sw), (ph, pw), (dh, dw) = as_pair(stride, 1), as_pair(padding, 0), as_pair(dilation, 1)
    nb, c, h, w = x.shape
    kh, kw = weight.shape[2], weight.shape[3]
    oh, ow = max(out_size(h, kh, sh, ph, dh), 0), max(out_size(w, kw, sw, pw, dw), 0)
    out = output_like(x, (nb, c, oh, ow), out, "depthwise_conv2d")
    if out.numel() == 0:
        return out
    if act is not None and act[0] not in CONV_ACTIVATIONS:
        raise ValueError(f"depthwise_conv2d: unknown activation {act!r}")
    acts = {"ACT": act[0] if act else ""}
    if act and act[0] == "clamp":
        acts.update(LO=_const(act[1]), HI=_const(act[2]))
    wc = weight.contiguous()
    block_p, block_c, warps = config or launch_config(c)
    grid = (triton.cdiv(nb * oh * ow, block_p), triton.cdiv(c, block_c))
    dense = x.is_contiguous(memory_format=torch.channels_last) and out.is_contiguous(memory_format=torch.channels_last)
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
