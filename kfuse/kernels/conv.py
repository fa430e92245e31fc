"""Conv2d as an implicit GEMM on NHWC (channels-last) with a generated epilogue.

The convolution is a GEMM with M = N*OH*OW output pixels, N = OC output channels and
K = KH*KW*C: the A tile (pixels x taps) is gathered from the input on the fly (never an
im2col buffer), B is the weight packed once as a (KH*KW*C, OC) matrix. Bias, activation and
residual are the same generated ``Epilogue`` as the GEMM template, applied to the fp32 tile.

Two K orders (a template parameter):

* ``FLAT_K=False``: the K loop runs over (kh, kw, channel block); every A load is BLOCK_K
  contiguous channels of one input pixel (coalesced on NHWC). The right choice when C >= 16.
* ``FLAT_K=True``: K is one flat index decoded into (kh, kw, c) per element; for the few-channel
  stem (C=3, 7x7) where a channel block would be mostly padding.

``conv_tma_kernel`` (Hopper, stride 1, configs with ``ConvConfig.tile_h``) is
the same GEMM over tile_n x BH x BW pixel tiles of one or more images: A is a TMA box of the NHWC input per (tap,
channel block), zero-filled outside the image (the padding), the output a TMA box store.

Grouped convolutions (RegNet, ResNeXt, SqueezeBERT's conv1d) are G independent implicit GEMMs: the grid's
second axis is the group, whose program reads its C/G input channels and its packed weight block and writes
its OC/G output channels (``conv_kernel`` only; ``pack_weight`` stacks the groups' (KH*KW*C/G, OC/G) blocks).
Depthwise ones (one input channel a group) run ``kfuse.kernels.depthwise`` (on a GPU where measured faster
than PyTorch), or PyTorch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kfuse.ir import ops
from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.kernels.codegen import as_pair, cdiv, generated, interpreting
from kfuse.kernels.depthwise import depthwise_conv2d, is_depthwise, may_use_rows, pack_rows_weight, rows_kernel_takes
from kfuse.kernels.epilogue import Epilogue, Operand, apply_reference, render
from kfuse.kernels.gemm import _go
from kfuse.kernels.tma import nhwc_box_descriptor, spatial_tile, tma_device
from kfuse.runtime.executor import KernelInfo, Step, lowering

_TEMPLATE = """
import triton
import triton.language as tl
from kfuse.kernels.pdl import pdl_start


@triton.jit
def _prologue(a, s_ptrs, t_ptrs, table_mask, in_map, IN_SHIFT: tl.constexpr, IN_RELU: tl.constexpr):
    # relu?(a * s + t) in fp32, rounded once to a's dtype as the separate kernel's store would be; taps outside the map
    # (padding, the K tail) stay zero: the conv pads the transformed map, and relu(t) is not zero
    af = a.to(tl.float32) * tl.load(s_ptrs, mask=table_mask, other=0.0).to(tl.float32)
    if IN_SHIFT:
        af += tl.load(t_ptrs, mask=table_mask, other=0.0).to(tl.float32)
        af = tl.where(in_map, af, 0.0)
    if IN_RELU:
        af = tl.maximum(af, 0.0, propagate_nan=tl.PropagateNan.ALL)
    return af.to(a.dtype)


@triton.jit
def conv_tile(
    bid, x_ptr, w_ptr, bias_ptr, c_ptr, s_ptr, t_ptr, {extra_ptrs}
    NB, C, H, W, OC, OH, OW,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_cn, stride_cc, stride_ch, stride_cw, stride_sn, stride_sc, stride_tn, stride_tc, {extra_strides}
    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLAT_K: tl.constexpr, HAS_BIAS: tl.constexpr, IN_SCALE: tl.constexpr, IN_SHIFT: tl.constexpr, IN_RELU: tl.constexpr,
    GROUPED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    # one output tile, ``bid`` its index (group-major for grouped convs): conv_kernel runs one a program, and the
    # persistent-thread-block form (kfuse.colocate.plan_conv) any block range, beside another kernel's blocks
    M = NB * OH * OW
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(OC, BLOCK_N)
    # grouped convs: C and OC are one group's channels; this tile's group reads its own input
    # channels and weight block. Only when GROUPED: a runtime offset on the weight pointer hides its
    # 16-byte alignment from the compiler, and the dense conv's weight tiles would load as scalars
    if GROUPED:
        g = bid // (num_m * num_n)
        pid = bid % (num_m * num_n)
    else:
        g = 0
        pid = bid
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % group) % size_m)
    pid_n = (pid % group) // size_m
    if GROUPED:
        x_ptr += g * C * stride_xc
        s_ptr += g * C * stride_sc
        t_ptr += g * C * stride_tc
        w_ptr += g * (KH * KW * C) * OC

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    # weight columns past OC are masked, not clamped: rn stays provably contiguous, so the
    # weight tiles load as 16-byte vectors (cp.async) instead of 2-byte scalars (see perf-notes)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = g * OC + rn  # the output channels (bias, epilogue operands, store)
    mask_m = offs_m < M
    mask_n = rn < OC
    # output pixel -> (image, oh, ow) and the top-left input tap of its window
    n_idx = offs_m // (OH * OW)
    rem = offs_m % (OH * OW)
    oh = rem // OW
    ow = rem % OW
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    x_base = x_ptr + n_idx * stride_xn
    # IN_SCALE: the input times s[image, channel] (squeeze-excitation); IN_SHIFT / IN_RELU: relu(x * s + t), a batch
    # norm + ReLU before the conv (DenseNet), where the map the conv pads with zeros is the normalised one
    s_base = s_ptr + n_idx * stride_sn
    t_base = t_ptr + n_idx * stride_tn
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FLAT_K:
        KTOT = KH * KW * C
        for k0 in range(0, KTOT, BLOCK_K):
            kk = k0 + offs_k
            c = kk % C
            t = kk // C
            ih = ih0[:, None] + (t // KW)[None, :] * DH
            iw = iw0[:, None] + (t % KW)[None, :] * DW
            ok = mask_m[:, None] & (kk < KTOT)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.load(x_base[:, None] + c[None, :] * stride_xc + ih * stride_xh + iw * stride_xw, mask=ok, other=0.0)
            if IN_SCALE:
                in_mask = mask_m[:, None] & (kk < KTOT)[None, :]
                a = _prologue(a, s_base[:, None] + c[None, :] * stride_sc, t_base[:, None] + c[None, :] * stride_tc, in_mask, ok,
                              IN_SHIFT, IN_RELU)
            b = tl.load(w_ptr + kk[:, None] * OC + rn[None, :], mask=(kk < KTOT)[:, None] & mask_n[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    else:
        # one flat loop over (kh, kw, channel block) so the compiler pipelines all of it
        n_cb = tl.cdiv(C, BLOCK_K)
        for it in range(0, KH * KW * n_cb):
            cb = it % n_cb
            tap = it // n_cb
            kh = tap // KW
            kw = tap % KW
            ih = ih0 + kh * DH
            iw = iw0 + kw * DW
            ok = mask_m & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            cc = cb * BLOCK_K + offs_k
            a_ptrs = x_base[:, None] + (ih * stride_xh + iw * stride_xw)[:, None] + cc[None, :] * stride_xc
            a_mask = ok[:, None] & (cc < C)[None, :]
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            if IN_SCALE:
                in_mask = mask_m[:, None] & (cc < C)[None, :]
                a = _prologue(a, s_base[:, None] + cc[None, :] * stride_sc, t_base[:, None] + cc[None, :] * stride_tc, in_mask, a_mask,
                              IN_SHIFT, IN_RELU)
            b_ptrs = w_ptr + (tap * C + cc)[:, None] * OC + rn[None, :]
            b = tl.load(b_ptrs, mask=(cc < C)[:, None] & mask_n[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
{load_extras}
{epilogue}
    c_ptrs = c_ptr + (n_idx * stride_cn + oh * stride_ch + ow * stride_cw)[:, None] + offs_n[None, :] * stride_cc
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def conv_kernel(
    x_ptr, w_ptr, bias_ptr, c_ptr, s_ptr, t_ptr, {extra_ptrs}
    NB, C, H, W, OC, OH, OW,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_cn, stride_cc, stride_ch, stride_cw, stride_sn, stride_sc, stride_tn, stride_tc, {extra_strides}
    SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLAT_K: tl.constexpr, HAS_BIAS: tl.constexpr, IN_SCALE: tl.constexpr, IN_SHIFT: tl.constexpr, IN_RELU: tl.constexpr,
    GROUPED: tl.constexpr, INPUT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    pdl_start(PDL)
    # one tile a program; the grid's second axis is the group (grouped convs)
    if GROUPED:
        bid = tl.program_id(1) * (tl.cdiv(NB * OH * OW, BLOCK_M) * tl.cdiv(OC, BLOCK_N)) + tl.program_id(0)
    else:
        bid = tl.program_id(0)
    conv_tile(bid, x_ptr, w_ptr, bias_ptr, c_ptr, s_ptr, t_ptr, {extra_ptrs}
              NB, C, H, W, OC, OH, OW, stride_xn, stride_xc, stride_xh, stride_xw,
              stride_cn, stride_cc, stride_ch, stride_cw, stride_sn, stride_sc, stride_tn, stride_tc, {extra_strides}
              SH, SW, PH, PW, DH, DW, KH, KW, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
              FLAT_K, HAS_BIAS, IN_SCALE, IN_SHIFT, IN_RELU, GROUPED, INPUT_PRECISION)


@triton.jit
def conv_tma_tile(
    bid, x_desc, w_ptr, bias_ptr, c_ptr, c_desc, {extra_ptrs}
    NB, C, H, W, OC, OH, OW,
    stride_cn, stride_cc, stride_ch, stride_cw, {extra_strides}
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    BNI: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, TMA_STORE: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    # one output tile of conv_tma_kernel, ``bid`` its index (as conv_tile for conv_kernel)
    pid = bid
    # the channel tiles of one spatial tile are launch neighbours: they read the same input boxes (L2)
    num_n = tl.cdiv(OC, BLOCK_N)
    pid_n = pid % num_n
    pid_s = pid // num_n
    # a spatial tile is BNI images x BH x BW pixels (several small images fill a tile without waste)
    tiles_w = tl.cdiv(OW, BW)
    per_group = tl.cdiv(OH, BH) * tiles_w
    img0 = (pid_s // per_group) * BNI
    tile = pid_s % per_group
    oh0 = (tile // tiles_w) * BH
    ow0 = (tile % tiles_w) * BW
    rows = tl.arange(0, BLOCK_M)
    n_idx = img0 + rows // (BH * BW)
    oh = oh0 + (rows % (BH * BW)) // BW
    ow = ow0 + rows % BW
    # pixels past the right / bottom edge or the batch are computed on zero-filled boxes, never stored
    mask_m = (oh < OH) & (ow < OW) & (n_idx < NB)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < OC
    rn = offs_n
    offs_k = tl.arange(0, BLOCK_K)
    # one box [BNI, BH, BW, BLOCK_K] per (tap, channel block): TMA zero-fills what lies outside the
    # image (negative coordinates too), the convolution's padding, and the channels past C.
    # acc^T = W^T @ A^T: A^T is the MMA's B operand, read from shared memory, so the box reshape is
    # a view of the TMA buffer (as the A operand it would be copied to registers every K step)
    acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    n_cb = tl.cdiv(C, BLOCK_K)
    for it in range(0, KH * KW * n_cb):
        cb = it % n_cb
        tap = it // n_cb
        box = x_desc.load([img0, oh0 + (tap // KW) * DH - PH, ow0 + (tap % KW) * DW - PW, cb * BLOCK_K])
        a = box.reshape(BLOCK_M, BLOCK_K)
        cc = cb * BLOCK_K + offs_k
        b = tl.load(w_ptr + (tap * C + cc)[:, None] * OC + rn[None, :], mask=(cc < C)[:, None] & mask_n[None, :], other=0.0)
        acc_t = tl.dot(tl.trans(b), tl.trans(a), acc_t, input_precision=INPUT_PRECISION)
    acc = tl.trans(acc_t)

    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
{load_extras}
{epilogue}
    if TMA_STORE:  # the box store clips the pixels past the edges and the channels past OC
        c_desc.store([img0, oh0, ow0, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty).reshape(BNI, BH, BW, BLOCK_N))
    else:
        c_ptrs = c_ptr + (n_idx * stride_cn + oh * stride_ch + ow * stride_cw)[:, None] + offs_n[None, :] * stride_cc
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def conv_tma_kernel(
    x_desc, w_ptr, bias_ptr, c_ptr, c_desc, {extra_ptrs}
    NB, C, H, W, OC, OH, OW,
    stride_cn, stride_cc, stride_ch, stride_cw, {extra_strides}
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    BNI: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, TMA_STORE: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    conv_tma_tile(tl.program_id(0), x_desc, w_ptr, bias_ptr, c_ptr, c_desc, {extra_ptrs}
                  NB, C, H, W, OC, OH, OW, stride_cn, stride_cc, stride_ch, stride_cw, {extra_strides}
                  PH, PW, DH, DW, KH, KW, BNI, BH, BW, BLOCK_M, BLOCK_N, BLOCK_K, HAS_BIAS, TMA_STORE, INPUT_PRECISION)
"""


def kernel_source(epi: Epilogue) -> str:
    n = epi.n_inputs
    loads = "\n".join(
        f"    x{j} = tl.load(x{j}_ptr + (n_idx * stride_x{j}n + oh * stride_x{j}h + ow * stride_x{j}w)[:, None]"
        f" + offs_n[None, :] * stride_x{j}c, mask=mask)"
        for j in range(n)
    )
    return _TEMPLATE.format(
        extra_ptrs="".join(f"x{j}_ptr, " for j in range(n)),
        extra_strides="".join(f"stride_x{j}n, stride_x{j}c, stride_x{j}h, stride_x{j}w, " for j in range(n)),
        load_extras=loads,
        epilogue=render(epi),
    )


@dataclass(frozen=True)
class ConvConfig:
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    flat_k: bool = False
    # > 0: conv_tma_kernel on tile_n images x tile_h x (block_m // (tile_h * tile_n)) pixel tiles
    # (Hopper, stride 1; the launcher falls back to conv_kernel where TMA cannot do the conv). The
    # tuner searches it with the tile of least waste for the problem (``least_waste_tile``)
    tile_h: int = 0
    tile_n: int = 1

    def describe(self) -> str:
        s = f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} s{self.num_stages}"
        s += " flatk" if self.flat_k else ""
        if not self.tile_h:
            return s
        n = f"{self.tile_n}x" if self.tile_n > 1 else ""
        return s + f" tma {n}{self.tile_h}x{self.block_m // (self.tile_h * self.tile_n)}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ConvParams:
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    pad_end: tuple[int, int] = (0, 0)  # more padding past the bottom / right (a folded asymmetric pad)

    @staticmethod
    def of(attrs: Mapping[str, Any]) -> ConvParams:
        stride, padding, dilation = as_pair(attrs.get("stride"), 1), as_pair(attrs.get("padding"), 0), as_pair(attrs.get("dilation"), 1)
        end = attrs.get("pad_end") or (0, 0)
        return ConvParams(stride, padding, dilation, int(attrs.get("groups", 1)), (int(end[0]), int(end[1])))


def out_hw(h: int, w: int, kh: int, kw: int, p: ConvParams) -> tuple[int, int]:
    oh = (h + 2 * p.padding[0] + p.pad_end[0] - p.dilation[0] * (kh - 1) - 1) // p.stride[0] + 1
    ow = (w + 2 * p.padding[1] + p.pad_end[1] - p.dilation[1] * (kw - 1) - 1) // p.stride[1] + 1
    return oh, ow


def supported(weight_shape: tuple[int, ...], p: ConvParams) -> str | None:
    """None when the template covers the conv, else the reason it falls back."""
    if len(weight_shape) != 4:
        return "only 2-D convolutions"
    if p.groups != 1 and weight_shape[1] == 1:
        return f"groups={p.groups} with one input channel a group: depthwise (kfuse.kernels.depthwise or PyTorch)"
    if weight_shape[0] % p.groups:
        return f"groups={p.groups} does not divide {weight_shape[0]} output channels"
    return None


def default_config(m: int, n: int, k: int, c: int, groups: int = 1) -> ConvConfig:
    """``n``, ``k``, ``c``: one group's output channels, GEMM depth and input channels."""
    flat = c < 16
    if interpreting():
        return ConvConfig(32, 32, 16, 4, 4, 1, flat)
    if groups > 1:  # a group's GEMM is narrow (RegNet: 64 channels): its tile no wider than the group
        bn, bk = min(128, max(16, 1 << (n - 1).bit_length())), min(64, max(16, 1 << (c - 1).bit_length()))
        return ConvConfig(128 if m * n * groups >= 1 << 20 else 64, bn, 32 if flat else bk, 8, 4, 3, flat)
    if m * n >= 1 << 20:
        return ConvConfig(128, 128, 32 if flat else 64, 8, 8, 3, flat)
    return ConvConfig(64, 64, 32 if flat else 64, 8, 4, 3, flat)


def plain_operand_count(attrs: Mapping[str, Any]) -> int:
    """How many of a ``conv_epilogue`` node's inputs the plain conv reads: x, weight, (bias)."""
    return 2 + bool(attrs.get("has_bias"))


def conv_operand_count(attrs: Mapping[str, Any]) -> int:
    """How many of a ``conv_epilogue`` node's inputs the conv itself reads: x, weight, (bias), (in_scale),
    (in_shift); the epilogue's operands follow."""
    return plain_operand_count(attrs) + bool(attrs.get("in_scale")) + bool(attrs.get("in_shift"))


def prologue_operands(xs: list[Any], attrs: Mapping[str, Any]) -> tuple[Any, Any]:
    """The ``in_scale`` and ``in_shift`` tables of a conv's inputs (None where the node has none)."""
    n_conv = conv_operand_count(attrs)
    shift = xs[n_conv - 1] if attrs.get("in_shift") else None
    scale = xs[n_conv - 1 - bool(shift is not None)] if attrs.get("in_scale") else None
    return scale, shift


def apply_prologue(x: torch.Tensor, scale: Any, shift: Any, relu: bool) -> torch.Tensor:
    """``relu?(x * scale + shift)`` in x's dtype: ``addcmul`` computes in fp32 on the GPU (PyTorch's opmath) and
    rounds once, as the separate pointwise kernel did, in two launches where fp32 temporaries would take five (a
    cuDNN candidate of such a conv runs it first)."""
    y = torch.addcmul(shift, x, scale) if shift is not None else x * scale
    return torch.relu_(y) if relu else y


def scaled_first(xs: list[Any], attrs: Mapping[str, Any]) -> list[Any]:
    """A conv with an input prologue (``in_scale``, ``in_shift``, ``in_act``) as the plain conv takes its inputs:
    the transformed x in x's place, the tables dropped."""
    scale, shift = prologue_operands(xs, attrs)
    x = apply_prologue(xs[0], scale, shift, attrs.get("in_act") == "relu")
    return [x, *xs[1 : plain_operand_count(attrs)], *xs[conv_operand_count(attrs) :]]


def _pad_end(x: torch.Tensor, params: ConvParams) -> torch.Tensor:
    """``x`` with the conv's ``pad_end`` rows and columns of zeros added (a copy; ``x`` itself without one)."""
    return F.pad(x, (0, params.pad_end[1], 0, params.pad_end[0])) if any(params.pad_end) else x


def pack_weight(w: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """(OC, C/G, KH, KW) -> G blocks of (KH*KW*C/G, OC/G), stacked row-major: in group g's block, row
    (kh*KW + kw)*C/G + c, column oc - g*OC/G. One (KH*KW*C, OC) matrix when G = 1."""
    oc, cg, kh, kw = w.shape
    return w.reshape(groups, oc // groups, cg, kh, kw).permute(0, 3, 4, 2, 1).reshape(-1, oc // groups).contiguous()


def _module(epi: Epilogue):  # noqa: ANN202 - a generated module of triton JITFunctions
    return generated("conv", epi.key(), lambda: kernel_source(epi))


def conv_epilogue(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    extras: list[torch.Tensor],
    epi: Epilogue,
    params: ConvParams,
    out_dtype: torch.dtype,
    config: ConvConfig | None = None,
    packed_weight: torch.Tensor | None = None,
    channels_last: bool = True,
    warmup: bool = False,
    out: torch.Tensor | None = None,
    in_scale: torch.Tensor | None = None,
    in_shift: torch.Tensor | None = None,
    in_relu: bool = False,
) -> torch.Tensor:
    """``epi(conv2d(x, weight) + bias, *extras)`` in one kernel. ``x`` is (N, C, H, W) in any
    memory format (channels-last is the fast one); the output is channels-last unless asked
    otherwise. ``packed_weight`` is ``pack_weight(weight)``, computed once by the caller. ``out``:
    a buffer to write into (the tuner's check poisons it first), of the output's shape and dtype, any
    strides (``concat_in_place`` passes a channel slice of a cat's buffer; the TMA store needs 16-byte
    aligned pixels, else the kernel stores through pointers). ``in_scale`` (N or 1, C, 1, 1): the conv reads
    ``x * in_scale`` (a squeeze-excitation's channel weights), rounded to x's dtype as the separate multiply
    would be; with ``in_shift`` (same shapes) and ``in_relu`` it reads ``relu?(x * in_scale + in_shift)`` (a
    batch norm and ReLU before the conv), computed in fp32 and rounded once."""
    why = supported(tuple(weight.shape), params)
    if why is not None:
        raise ValueError(f"conv_epilogue: {why}")
    nb, c, h, w = x.shape
    oc, cw, kh, kw = weight.shape
    if cw * params.groups != c:
        raise ValueError(f"conv_epilogue: input has {c} channels, weight expects {cw} x {params.groups} groups")
    oh, ow = out_hw(h, w, kh, kw, params)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if out is None:
        out = torch.empty((nb, oc, oh, ow), dtype=out_dtype, device=x.device, memory_format=fmt)
    elif tuple(out.shape) != (nb, oc, oh, ow) or out.dtype != out_dtype:  # any strides: a channel slice of a cat's buffer too
        raise ValueError(f"conv_epilogue: out is {tuple(out.shape)} {out.dtype}, expected {(nb, oc, oh, ow)} {out_dtype}")
    if out.numel() == 0:
        return out
    if max(x.numel(), out.numel()) >= 2**31:
        raise ValueError("conv_epilogue: tensors of 2**31 elements or more need 64-bit indexing (not in this template)")
    if len(extras) != epi.n_inputs:
        raise ValueError(f"epilogue expects {epi.n_inputs} extra inputs, got {len(extras)}")
    wp = packed_weight if packed_weight is not None else pack_weight(weight, params.groups)
    ex = [torch.broadcast_to(e, out.shape) for e in extras]
    m, kdim = nb * oh * ow, kh * kw * cw
    cfg = config or default_config(m, oc // params.groups, kdim, cw, params.groups)
    ex_strides: list[int] = []
    for e in ex:
        ex_strides += [e.stride(0), e.stride(1), e.stride(2), e.stride(3)]
    precision = "ieee" if x.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    if (in_shift is not None or in_relu) and in_scale is None:
        raise ValueError("conv_epilogue: in_shift / in_relu need in_scale")
    scale2d = _channel_table(in_scale, "in_scale", nb, c)
    shift2d = _channel_table(in_shift, "in_shift", nb, c)
    dense = params.groups == 1 and in_scale is None and params.pad_end == (0, 0)
    tma = tma_descriptors(x, out, cfg, params) if cfg.tile_h and dense else None
    if tma is not None:
        x_desc, c_desc, block_k = tma
        bh, bw = spatial_tile(cfg.block_m, cfg.tile_h, "conv", cfg.tile_n)
        grid = (cdiv(nb, cfg.tile_n) * cdiv(oh, bh) * cdiv(ow, bw) * cdiv(oc, cfg.block_n),)
        _go(_module(epi).conv_tma_kernel, grid, warmup,
            x_desc, wp, bias if bias is not None else wp, out, c_desc if c_desc is not None else out, *ex,
            nb, c, h, w, oc, oh, ow,
            out.stride(0), out.stride(1), out.stride(2), out.stride(3), *ex_strides,
            PH=params.padding[0], PW=params.padding[1], DH=params.dilation[0], DW=params.dilation[1], KH=kh, KW=kw,
            BNI=cfg.tile_n, BH=bh, BW=bw, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
            HAS_BIAS=bias is not None, TMA_STORE=c_desc is not None, INPUT_PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        return out
    grid = (cdiv(m, cfg.block_m) * cdiv(oc // params.groups, cfg.block_n), params.groups)
    s_args = (scale2d, scale2d.stride(0), scale2d.stride(1)) if scale2d is not None else (wp, 0, 0)
    t_args = (shift2d, shift2d.stride(0), shift2d.stride(1)) if shift2d is not None else (wp, 0, 0)
    _go(_module(epi).conv_kernel, grid, warmup,
        x, wp, bias if bias is not None else wp, out, s_args[0], t_args[0], *ex,
        nb, cw, h, w, oc // params.groups, oh, ow,
        x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3), *s_args[1:], *t_args[1:], *ex_strides,
        SH=params.stride[0], SW=params.stride[1], PH=params.padding[0], PW=params.padding[1],
        DH=params.dilation[0], DW=params.dilation[1], KH=kh, KW=kw,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        FLAT_K=cfg.flat_k, HAS_BIAS=bias is not None, IN_SCALE=in_scale is not None, IN_SHIFT=in_shift is not None,
        IN_RELU=in_relu, GROUPED=params.groups > 1,
        INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def _channel_table(t: torch.Tensor | None, name: str, nb: int, c: int) -> torch.Tensor | None:
    """A prologue table (N or 1, C, 1, 1), or (C, 1, 1), as the kernel reads it: [N, C] (broadcast over images)."""
    if t is None:
        return None
    if t.dim() == 3:  # (C, 1, 1): one value a channel for every image
        t = t.unsqueeze(0)
    if t.dim() != 4 or t.shape[2:] != (1, 1) or t.shape[1] != c or t.shape[0] not in (1, nb):
        raise ValueError(f"conv_epilogue: {name} must be (N or 1, {c}, 1, 1), got {tuple(t.shape)}")
    return t.reshape(t.shape[0], c).expand(nb, c)


def tma_descriptors(x: torch.Tensor, out: torch.Tensor, cfg: ConvConfig, params: ConvParams) -> tuple[Any, Any, int] | None:
    """For ``conv_tma_kernel``: the descriptor of the NHWC input (box [tile_n, BH, BW, BLOCK_K]),
    of the NHWC output (box [tile_n, BH, BW, BLOCK_N]; None: the kernel stores through pointers) and the
    channel step; None when TMA cannot do the conv (stride other than 1: a box is a dense window,
    while dilation only shifts the taps; an NCHW or misaligned input; another dtype; a GPU before
    Hopper). The channel step is the config's, or less for narrow inputs (C = 16 or 32 would
    otherwise move and multiply boxes that are mostly zero-filled channels)."""
    bh, bw = spatial_tile(cfg.block_m, cfg.tile_h, "conv", cfg.tile_n)
    if params.stride != (1, 1) or not tma_device(x):
        return None
    c = x.shape[1]
    block_k = max(16, min(cfg.block_k, 1 << (c - 1).bit_length()))
    x_desc = nhwc_box_descriptor(x, bh, bw, block_k, cfg.tile_n)
    if x_desc is None:
        return None
    return x_desc, nhwc_box_descriptor(out, bh, bw, cfg.block_n, cfg.tile_n), block_k


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    extras: list[torch.Tensor],
    epi: Epilogue,
    params: ConvParams,
    out_dtype: torch.dtype,
    in_scale: torch.Tensor | None = None,
    in_shift: torch.Tensor | None = None,
    in_relu: bool = False,
) -> torch.Tensor:
    """The oracle: fp32 conv (+ bias) then the epilogue through the op registry; ``in_scale`` (``in_shift``,
    ``in_relu``): of ``relu?(x * in_scale + in_shift)`` in x's dtype (``apply_prologue``)."""
    b = None if bias is None else bias.float()
    x = _pad_end(x if in_scale is None else apply_prologue(x, in_scale, in_shift, in_relu), params)
    acc = F.conv2d(x.float(), weight.float(), b, params.stride, params.padding, params.dilation, params.groups)
    return apply_reference(acc, [e.float() if e.is_floating_point() else e for e in extras], epi).to(out_dtype)


# ---------------------------------------------------------------------------------------
# lowerings: ``conv_epilogue`` nodes, and depthwise ``conv2d`` (the depthwise kernel or a reported fallback)
# ---------------------------------------------------------------------------------------
@lowering("conv_epilogue")
def lower_conv_epilogue(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    """A Step running the node with the implicit-GEMM template (None: PyTorch reference)."""
    if backend == "torch":
        return None
    x_t, w_t = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
    assert isinstance(x_t, TensorType) and isinstance(w_t, TensorType)
    params = ConvParams.of(node.attrs)
    if supported(w_t.shape, params) is not None:
        return None
    epi: Epilogue = node.attrs["epilogue"]
    has_bias, scaled = bool(node.attrs.get("has_bias")), bool(node.attrs.get("in_scale"))
    in_relu = node.attrs.get("in_act") == "relu"
    n_conv = conv_operand_count(node.attrs)
    out_t = node.ttype
    nb, c, h, w = x_t.shape
    oc, cg, kh, kw = w_t.shape
    oh, ow = out_hw(h, w, kh, kw, params)
    cfg = node.attrs.get("config")
    tunable = params.groups == 1  # the tuner's conv problems are dense convs
    if cfg is None and tunable and options is not None and getattr(options, "tune", "none") != "none" and backend == "triton":
        from kfuse.tune.tuner import lookup_config, problem_of

        prob = problem_of(node, graph)
        cfg = lookup_config(prob, options.tune) if prob is not None else None
    cfg = cfg or default_config(nb * oh * ow, oc // params.groups, kh * kw * cg, cg, params.groups)
    w_const = graph.constants.get(node.inputs[1])
    packed: dict[torch.device, torch.Tensor] = {}
    if w_const is not None:  # pack the constant weight once, at lowering time
        packed[w_const.device] = pack_weight(w_const, params.groups)
    channels_last = out_t.layout == "channels_last"

    def packed_weight(xs: list[torch.Tensor]) -> torch.Tensor:
        wp = packed.get(xs[0].device)
        if wp is None:
            wp = next(iter(packed.values())).to(xs[0].device) if packed else pack_weight(xs[1], params.groups)
            if w_const is not None:
                packed[xs[0].device] = wp
        return wp

    def run(xs: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        bias = xs[2] if has_bias else None
        s, t = prologue_operands(xs, node.attrs)
        return conv_epilogue(xs[0], xs[1], bias, xs[n_conv:], epi, params, out_t.dtype, cfg, packed_weight(xs), channels_last, out=out,
                             in_scale=s, in_shift=t, in_relu=in_relu)  # fmt: skip

    run.writes_strided_out = True  # type: ignore[attr-defined]  # concat_in_place: straight into a cat's slice
    n_plain = plain_operand_count(node.attrs)

    def run_plain(xs: list[torch.Tensor]) -> torch.Tensor:  # the inputs less the tables: x already transformed
        bias = xs[2] if has_bias else None
        return conv_epilogue(xs[0], xs[1], bias, xs[n_plain:], epi, params, out_t.dtype, cfg, packed_weight(xs), channels_last)

    info = KernelInfo(node.name, "conv_epilogue", node.attrs["fused_ops"], cfg.describe(), epi.describe())
    if backend == "triton" and torch.cuda.is_available() and os.environ.get("KFUSE_CONV_VS_CUDNN", "1") == "1":
        library = cudnn_candidates(node, graph, epi, params, has_bias, out_t.dtype)
        if scaled:  # the library runs the multiply (norm, ReLU) first, as the model did
            library = {k: _scaling_first(f, node.attrs) for k, f in library.items()}
            # and the template on the transformed map, which may take the TMA kernel the prologue conv cannot: a plan
            # that fused the transform is then never slower than the transform as its own ops and the best conv
            library["template_after_prologue"] = _scaling_first(run_plain, node.attrs)
        cands = {"template": run, **library}
        from kfuse.runtime.choice import choose, problem_key

        choice, times = choose(node, graph, cands, problem_key(node, graph))
        if choice != "template":
            why = f"{choice} {times[choice] * 1e3:.1f} us vs template {cfg.describe()} {times['template'] * 1e3:.1f} us"
            template = "conv_epilogue" if choice == "template_after_prologue" else "cudnn+epilogue"
            info = KernelInfo(node.name, template, node.attrs["fused_ops"], why, epi.describe())
            return Step(node.name, node.inputs, cands[choice], info)
    return Step(node.name, node.inputs, run, info)


def _scaling_first(
    run: Callable[[list[torch.Tensor]], torch.Tensor], attrs: Mapping[str, Any]
) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """A library candidate of a conv with an input prologue: the prologue as its own ops, then the conv on it."""

    def scaled(xs: list[torch.Tensor]) -> torch.Tensor:
        return run(scaled_first(xs, attrs))

    return scaled


def once_per_device(convert: Callable[[torch.Tensor], torch.Tensor], constant: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """``convert`` of a weight: a ``constant`` one converted on its first call per device, one computed in the
    graph on every call."""
    cache: dict[torch.device, torch.Tensor] = {}

    def get(w: torch.Tensor) -> torch.Tensor:
        if not constant:
            return convert(w)
        if w.device not in cache:
            cache[w.device] = convert(w)
        return cache[w.device]

    return get


def cudnn_fusable(epi: Epilogue) -> str | None:
    """The cuDNN fused call that covers ``epi`` (after conv + bias): "relu" (conv+bias+ReLU) or
    "add_relu" (ReLU(conv + bias + z), ResNet's residual block end); None otherwise."""
    st = epi.steps
    if len(st) == 1 and epi.n_inputs == 0 and st[0].op == "relu" and st[0].args == (Operand("reg", 0),):
        return "relu"
    if (
        len(st) == 2
        and epi.n_inputs == 1
        and st[0].op == "add"
        and {(a.kind, a.index) for a in st[0].args} == {("reg", 0), ("in", 0)}
        and st[1].op == "relu"
        and st[1].args == (Operand("reg", 1),)
    ):
        return "add_relu"
    return None


def cudnn_candidates(node: Node, graph: Graph, epi: Epilogue, params: ConvParams, has_bias: bool, out_dtype: torch.dtype) -> dict[str, Any]:
    """cuDNN variants of a conv node, each measured against the template (Bolt's rule: keep the
    template only where it is faster):

    * ``cudnn``: ``F.conv2d`` then the epilogue as PyTorch ops;
    * ``cudnn_fused``: ``cudnn_convolution_relu`` / ``cudnn_convolution_add_relu`` (bias, residual
      and ReLU inside cuDNN's kernel) when the epilogue is one of those;
    * ``cudnn_pad8`` (and fused): input channels zero-padded to a multiple of 8 (weights padded once),
      because NHWC cuDNN kernels with few channels (the 3-channel RGB stem) are far from tensor-core
      speed; the padding copy is inside the measured time."""
    n_conv = 3 if has_bias else 2
    fused = cudnn_fusable(epi)
    c = graph.type_of(node.inputs[0]).shape[1]
    pad = -c % 8
    w_const = graph.constants.get(node.inputs[1])
    channels_last = node.ttype.layout == "channels_last"

    constant = w_const is not None
    padded_weight = once_per_device(lambda w: F.pad(w, (0, 0, 0, 0, 0, pad)).contiguous(memory_format=torch.channels_last), constant)
    # cuDNN's NHWC kernels take the weight channels-last too; F.conv2d converts a contiguous one
    # on every call (a strided copy kernel before each conv: 2-8 us each, ~15% of ResNet-50 B1 on
    # the H200, experiments/graph_timeline.py)
    nhwc_weight = once_per_device(lambda w: w.contiguous(memory_format=torch.channels_last), constant)

    def weight(w: torch.Tensor) -> torch.Tensor:
        if not channels_last or w.is_contiguous(memory_format=torch.channels_last):
            return w
        return nhwc_weight(w)

    def padded(xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return _pad_input(xs[0], pad), padded_weight(xs[1])

    def make(use_pad: bool, use_fused: str | None) -> Any:
        def run_cudnn(xs: list[torch.Tensor]) -> torch.Tensor:
            x, w = padded(xs) if use_pad else (xs[0], weight(xs[1]))
            x = _pad_end(x, params)  # the model's own asymmetric pad, a copy, as eager runs it
            bias = xs[2] if has_bias else None
            st, pd, dl = list(params.stride), list(params.padding), list(params.dilation)
            if use_fused == "relu":
                return torch.cudnn_convolution_relu(x, w, bias, st, pd, dl, params.groups).to(out_dtype)
            if use_fused == "add_relu":
                return torch.cudnn_convolution_add_relu(x, w, xs[n_conv], 1.0, bias, st, pd, dl, params.groups).to(out_dtype)
            y = F.conv2d(x, w, bias, params.stride, params.padding, params.dilation, params.groups)
            return apply_reference(y, xs[n_conv:], epi).to(out_dtype)

        return run_cudnn

    cands = {"cudnn": make(False, None)}
    if fused:
        cands["cudnn_fused"] = make(False, fused)
    if pad and c < 64 and params.groups == 1 and not any(params.pad_end):
        cands["cudnn_pad8"] = make(True, None)
        if fused:
            cands["cudnn_pad8_fused"] = make(True, fused)
    kh, kw = graph.type_of(node.inputs[1]).shape[2:]
    if (
        params.stride == (kh, kw)
        and params.padding == (0, 0)
        and params.dilation == (1, 1)
        and params.groups == 1
        and not any(params.pad_end)
    ):
        cands["patch_gemm"] = _patch_gemm(node, graph, epi, has_bias, out_dtype)
    return cands


def _patch_gemm(node: Node, graph: Graph, epi: Epilogue, has_bias: bool, out_dtype: torch.dtype) -> Any:
    """A convolution whose windows do not overlap (stride = kernel, no padding: ViT's patch
    embedding) is a reshape of the input into patches and one GEMM: no implicit-GEMM gather,
    cuBLAS's speed for the (N*OH*OW, C*KH*KW) x (C*KH*KW, OC) product."""
    n_conv = 3 if has_bias else 2
    channels_last = node.ttype.layout == "channels_last"
    w_mat: dict[torch.device, torch.Tensor] = {}
    w_const = graph.constants.get(node.inputs[1])

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        x, w = xs[0], xs[1]
        nb, c, h, wd = x.shape
        oc, _, kh, kw = w.shape
        oh, ow = h // kh, wd // kw
        wm = w_mat.get(w.device)
        if wm is None:
            wm = w.reshape(oc, c * kh * kw).t().contiguous()
            if w_const is not None:
                w_mat[w.device] = wm
        patches = x[:, :, : oh * kh, : ow * kw].reshape(nb, c, oh, kh, ow, kw).permute(0, 2, 4, 1, 3, 5).reshape(nb * oh * ow, -1)
        y = torch.addmm(xs[2], patches, wm) if has_bias else patches @ wm
        y = y.view(nb, oh, ow, oc).permute(0, 3, 1, 2)  # NHWC storage, NCHW logical: channels-last
        y = apply_reference(y, xs[n_conv:], epi).to(out_dtype)
        return y if channels_last else y.contiguous()

    return run


def _pad_input(x: torch.Tensor, pad: int) -> torch.Tensor:
    n, c, h, w = x.shape
    xp = torch.empty((n, c + pad, h, w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    xp[:, :c].copy_(x)
    xp[:, c:].zero_()
    return xp


def nhwc_at_run_time(graph: Graph, name: str) -> bool:
    """Whether value ``name`` is channels-last in memory when the model runs: typed so (a conv's output), or a
    (0, 3, 1, 2) permute of a contiguous NHWC tensor, which the IR types as NCHW-contiguous (ConvNeXt's block
    inputs after ``sink_permutes``; session 38: timing those depthwise convs on NCHW inputs kept PyTorch's for
    15 of 18 layers where the channels-last kernel is faster)."""
    t = graph.type_of(name)
    if isinstance(t, TensorType) and t.layout == "channels_last":
        return True
    p = graph.node_map().get(name)
    if p is None or p.op != "permute" or tuple(p.attrs.get("dims", ())) != (0, 3, 1, 2):
        return False
    src = graph.type_of(p.inputs[0])
    return isinstance(src, TensorType) and src.rank == 4 and src.layout == "contiguous"


@lowering("conv2d")
def lower_conv2d(node: Node, graph: Graph, backend: str) -> Step | None:
    """conv2d nodes left after epilogue fusion are the ones without the implicit-GEMM template (grouped,
    depthwise). Depthwise ones run ``kfuse.kernels.depthwise`` (on a GPU only where measured faster than
    PyTorch); the rest run in PyTorch and the plan says why."""
    x_t, w_t = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
    params = ConvParams.of(node.attrs)
    why = supported(w_t.shape if isinstance(w_t, TensorType) else (), params) or "not fused"
    attrs = node.attrs
    torch_step = Step(node.name, node.inputs, lambda xs: ops.run_reference("conv2d", xs, attrs),
                      KernelInfo(node.name, "fallback", ("conv2d",), why))  # fmt: skip
    if backend == "torch" or not (isinstance(x_t, TensorType) and isinstance(w_t, TensorType) and x_t.rank == 4):
        return torch_step
    if not is_depthwise(w_t.shape, x_t.shape[1], params.groups) or x_t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return torch_step

    act = attrs.get("act")
    w_const = graph.constants.get(node.inputs[1])
    rows_weight = once_per_device(pack_rows_weight, w_const is not None)  # the rows kernel's (KH, KW, C) fp32 weight
    if w_const is not None:  # packed at lowering time, as the implicit-GEMM conv's weight (never inside a graph capture)
        rows_weight(w_const)

    def make(kernel: str) -> Callable[[list[torch.Tensor]], torch.Tensor]:
        def run(xs: list[torch.Tensor]) -> torch.Tensor:
            wp = rows_weight(xs[1]) if w_const is not None and kernel != "taps" else None
            # the rows kernel was chosen on channels-last inputs; a call that passes another layout gets "auto"
            dense = xs[0].is_contiguous(memory_format=torch.channels_last)
            return depthwise_conv2d(xs[0], xs[1], xs[2] if len(xs) > 2 else None, params.stride, params.padding, params.dilation,
                                    act=act, kernel=kernel if kernel != "rows" or dense else "auto", packed_weight=wp,
                                    pad_end=params.pad_end)  # fmt: skip

        return run

    run = make("auto")
    desc = f"depthwise {w_t.shape[2]}x{w_t.shape[3]} s{params.stride} p{params.padding} over {x_t.shape[1]} channels"
    desc += f" (+{params.pad_end} at the end)" if any(params.pad_end) else ""
    desc += f" + {act[0]}" if act else ""
    if backend == "triton" and torch.cuda.is_available():
        # kfuse's kernels and PyTorch's, timed: which is fastest depends on the image size, channels and taps
        from kfuse.runtime.choice import choose, example_inputs, problem_key

        candidates = {"taps": make("taps")}
        nhwc = nhwc_at_run_time(graph, node.inputs[0])
        xs = example_inputs(node, graph)
        if nhwc:  # timed on the memory format the call will see: NCHW runs the general (slower) kernel
            xs[0] = xs[0].contiguous(memory_format=torch.channels_last)
        rows_ok = nhwc and rows_kernel_takes(params.stride, params.dilation, w_t.shape[2]) and not any(params.pad_end)
        if rows_ok and may_use_rows(w_t.shape[2], w_t.shape[3], node.ttype.shape[2]):
            candidates["rows"] = make("rows")
        choice, times = choose(node, graph, {**candidates, "torch": torch_step.fn}, (problem_key(node, graph), nhwc), xs)
        ours = min(candidates, key=lambda k: times[k])
        if choice == "torch":
            return Step(node.name, node.inputs, torch_step.fn,
                        KernelInfo(node.name, "fallback", ("conv2d",), f"{desc}: PyTorch measured faster ({times['torch'] * 1e3:.1f} "
                                   f"us vs {times[ours] * 1e3:.1f})"))  # fmt: skip
        run = candidates[choice]
        desc += f"; {choice} kernel {times[choice] * 1e3:.1f} us vs PyTorch {times['torch'] * 1e3:.1f} us"
    return Step(node.name, node.inputs, run, KernelInfo(node.name, "depthwise_conv", ("conv2d",), desc))
