"""Max and average pooling on channels-last (NHWC) tensors.

ResNet-50's stem pool (3x3, stride 2, on 64x112x112x64 fp16 at batch 64) took 0.224 ms in
PyTorch's channels-last ``max_pool2d`` on the H200, 10% of the whole model, against a 0.030 ms
floor (read 103 MB, write 26 MB). This kernel reads each window tap as a [pixels, channels] tile
whose channel dimension is contiguous, so the loads are 16-byte vectors and every input byte is
read about once from DRAM (the overlapping taps hit L2). Any strides work (NCHW too), vectorised
when the channel stride is 1. Like every kfuse kernel that has a PyTorch twin, the lowering times
both on the GPU and keeps the faster.

Average pooling (Inception-v3's nine pool branches, DenseNet's transitions) is the same tile walk with a sum
and PyTorch's divisor: the window clipped to the padded input (``count_include_pad``, the default), to the input
itself, or ``divisor_override``. Both kernels take an ``out`` of any strides, so a pool's output can be made in
its slice of a concatenation's buffer (``runtime/concat_in_place.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels import pdl
from kfuse.kernels.codegen import as_pair
from kfuse.kernels.nhwc_window import measured_step, out_size, output_like, tile, tiling
from kfuse.kernels.pdl import pdl_start

__all__ = ["avg_pool2d", "lower_avg_pool2d", "lower_max_pool2d", "max_pool2d", "out_size"]


@triton.jit
def _max_pool2d_kernel(
    x_ptr, y_ptr, N, C, H, W, OH, OW,
    sxn, sxc, sxh, sxw, syn, syc, syh, syw,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
    PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    offs_c, mask_p, mask_c, n, oh, ow = tile(N, C, OH, OW, BLOCK_P, BLOCK_C)
    acc = tl.full((BLOCK_P, BLOCK_C), float("-inf"), tl.float32)
    for kh in tl.static_range(KH):
        for kw in tl.static_range(KW):
            ih = oh * SH - PH + kh * DH
            iw = ow * SW - PW + kw * DW
            ok = mask_p & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            ptrs = x_ptr + (n * sxn + ih * sxh + iw * sxw)[:, None] + offs_c[None, :] * sxc
            v = tl.load(ptrs, mask=ok[:, None] & mask_c[None, :], other=float("-inf"))
            acc = tl.maximum(acc, v.to(tl.float32), propagate_nan=tl.PropagateNan.ALL)  # NaN wins, as in PyTorch
    y_ptrs = y_ptr + (n * syn + oh * syh + ow * syw)[:, None] + offs_c[None, :] * syc
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_p[:, None] & mask_c[None, :])


@triton.jit
def _avg_pool2d_kernel(
    x_ptr, y_ptr, N, C, H, W, OH, OW,
    sxn, sxc, sxh, sxw, syn, syc, syh, syw,
    KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
    COUNT_PAD: tl.constexpr, DIVISOR: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    offs_c, mask_p, mask_c, n, oh, ow = tile(N, C, OH, OW, BLOCK_P, BLOCK_C)
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for kh in tl.static_range(KH):
        for kw in tl.static_range(KW):
            ih = oh * SH - PH + kh
            iw = ow * SW - PW + kw
            ok = mask_p & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            ptrs = x_ptr + (n * sxn + ih * sxh + iw * sxw)[:, None] + offs_c[None, :] * sxc
            acc += tl.load(ptrs, mask=ok[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
    # PyTorch's divisor: the window clipped to the padded input, or to the input itself, or the override
    h0 = oh * SH - PH
    w0 = ow * SW - PW
    h1 = tl.minimum(h0 + KH, H + PH)
    w1 = tl.minimum(w0 + KW, W + PW)
    if DIVISOR > 0:
        div = tl.full(h0.shape, DIVISOR, tl.float32)
    elif COUNT_PAD:
        div = ((h1 - h0) * (w1 - w0)).to(tl.float32)
    else:
        div = ((tl.minimum(h1, H) - tl.maximum(h0, 0)) * (tl.minimum(w1, W) - tl.maximum(w0, 0))).to(tl.float32)
    y_ptrs = y_ptr + (n * syn + oh * syh + ow * syw)[:, None] + offs_c[None, :] * syc
    tl.store(y_ptrs, (acc / div[:, None]).to(y_ptr.dtype.element_ty), mask=mask_p[:, None] & mask_c[None, :])


def _window(op: str, x: torch.Tensor, kernel_size: Any, stride: Any, padding: Any) -> tuple[tuple[int, int], ...]:
    """(kernel, stride, padding) pairs of a 2-D pool as PyTorch reads them (no stride: the kernel's), checked."""
    if x.dim() != 4:
        raise ValueError(f"{op}: expected an (N, C, H, W) tensor, got shape {tuple(x.shape)}")
    kh, kw = as_pair(kernel_size, 1)
    sh, sw = as_pair(stride if stride not in (None, (), []) else kernel_size, 1)
    ph, pw = as_pair(padding, 0)
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(f"{op}: padding {(ph, pw)} must be at most half the kernel {(kh, kw)}")
    return (kh, kw), (sh, sw), (ph, pw)


def avg_pool2d(
    x: torch.Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.avg_pool2d`` for a 4-D tensor of any memory format; the output keeps the input's format. ``out``: any
    strides (a slice of a concatenation's buffer)."""
    (kh, kw), (sh, sw), (ph, pw) = _window("avg_pool2d", x, kernel_size, stride, padding)
    if divisor_override is not None and divisor_override <= 0:
        raise ValueError(f"avg_pool2d: divisor_override must be positive, got {divisor_override}")
    nb, c, h, w = x.shape
    oh, ow = out_size(h, kh, sh, ph, 1, ceil_mode), out_size(w, kw, sw, pw, 1, ceil_mode)
    out = output_like(x, (nb, c, oh, ow), out, "avg_pool2d")
    if out.numel() == 0:
        return out
    block_p, block_c, grid = tiling(nb * oh * ow, c)
    _avg_pool2d_kernel[grid](
        x, out, nb, c, h, w, oh, ow, *x.stride(), *out.stride(),
        KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, COUNT_PAD=bool(count_include_pad), DIVISOR=int(divisor_override or 0),
        BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4, **pdl.launch_kwargs(),
    )  # fmt: skip
    return out


def max_pool2d(
    x: torch.Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.max_pool2d`` for a 4-D tensor of any memory format; the output keeps the input's
    format (channels-last in, channels-last out)."""
    (kh, kw), (sh, sw), (ph, pw) = _window("max_pool2d", x, kernel_size, stride, padding)
    dh, dw = as_pair(dilation, 1)
    nb, c, h, w = x.shape
    oh, ow = out_size(h, kh, sh, ph, dh, ceil_mode), out_size(w, kw, sw, pw, dw, ceil_mode)
    out = output_like(x, (nb, c, oh, ow), out, "max_pool2d")
    if out.numel() == 0:
        return out
    block_p, block_c, grid = tiling(nb * oh * ow, c)
    _max_pool2d_kernel[grid](
        x, out, nb, c, h, w, oh, ow, *x.stride(), *out.stride(),
        KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, BLOCK_P=block_p, BLOCK_C=block_c,
        num_warps=4, **pdl.launch_kwargs(),
    )  # fmt: skip
    return out


def lower_max_pool2d(node: Any, graph: Any, backend: str, options: Any = None) -> Any:
    """A Step running the kernel; on a GPU only where it is measured faster than PyTorch."""
    a = dict(node.attrs)

    def run(xs: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        return max_pool2d(xs[0], a["kernel_size"], a.get("stride"), a.get("padding", 0), a.get("dilation", 1), a.get("ceil_mode", False),
                          out=out)  # fmt: skip

    run.writes_strided_out = True  # type: ignore[attr-defined]  # concat_in_place: straight into a cat's slice
    return measured_step(node, graph, backend, run, "pool", f"k{as_pair(a['kernel_size'], 1)} s{a.get('stride')} p{a.get('padding', 0)}")


def lower_avg_pool2d(node: Any, graph: Any, backend: str, options: Any = None) -> Any:
    """A Step running the average-pool kernel; on a GPU only where it is measured faster than PyTorch."""
    a = dict(node.attrs)
    x_t = graph.type_of(node.inputs[0])
    if getattr(x_t, "rank", 0) != 4:
        return None

    def run(xs: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        return avg_pool2d(xs[0], a["kernel_size"], a.get("stride"), a.get("padding", 0), a.get("ceil_mode", False),
                          a.get("count_include_pad", True), a.get("divisor_override"), out=out)  # fmt: skip

    run.writes_strided_out = True  # type: ignore[attr-defined]
    from kfuse.passes.layout import runs_nhwc

    desc = f"avg k{as_pair(a['kernel_size'], 1)} s{a.get('stride')} p{a.get('padding', 0)}"
    return measured_step(node, graph, backend, run, "pool", desc, channels_last=runs_nhwc(graph))
