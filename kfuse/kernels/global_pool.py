"""Global average pooling (``adaptive_avg_pool2d(x, 1)``) of a channels-last map, coalesced along the channels.

Squeeze-excitation blocks (RegNet-Y, EfficientNet, MobileNet-V3) pool every block's map to [N, C, 1, 1], and
every CNN pools before its head. The generated reduction (``kernels/pointwise.py``) gives each program whole
(image, channel) rows and reads along a row. On an NHWC map a row's pixels lie C elements apart, so a load
touches one 2-byte value per 32-byte sector, 16 times the sectors of a contiguous read (the L2 may keep the rest
of a sector for the programs of the neighbouring channels; how much it does was not measured). Here a program
takes a block of channels of one image, reads its pixels as [pixels, channels] tiles whose channel dim is
contiguous (16-byte vectors) and writes the means. One launch, as before: splitting the pixels
too would need a zeroed fp32 buffer and a finishing kernel, two launches more per pool (22 SE blocks on
RegNet-Y), so the channel block narrows (64 -> 16) instead where a map gives too few programs.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels.nhwc_window import measured_step, pixel_stride


@triton.jit
def _mean_pixels(x_ptr, y_ptr, C, HW, inv, sxn, sxc, sxp, syn, syc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cs < C
    total = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r0 in range(0, HW, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        ok = (rows < HW)[:, None] & c_ok[None, :]
        x = tl.load(x_ptr + n * sxn + rows[:, None] * sxp + cs[None, :] * sxc, mask=ok, other=0.0)
        total += tl.sum(x.to(tl.float32), 0)
    tl.store(y_ptr + n * syn + cs * syc, (total * inv).to(y_ptr.dtype.element_ty), mask=c_ok)


def global_avg_pool(x: torch.Tensor, out: torch.Tensor | None = None, programs: int = 264) -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, 1)`` for a 4-D x of any memory format (coalesced where the channels are
    contiguous); the output is [N, C, 1, 1] in x's memory format."""
    if x.dim() != 4:
        raise ValueError(f"global_avg_pool: a 4-D input, got {tuple(x.shape)}")
    if pixel_stride(x) is None:
        x = x.contiguous(memory_format=torch.channels_last)
    n, c, h, w = x.shape
    hw = h * w
    fmt = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    y = out if out is not None else torch.empty((n, c, 1, 1), device=x.device, dtype=x.dtype, memory_format=fmt)
    if y.shape != (n, c, 1, 1):
        raise ValueError(f"global_avg_pool: out {tuple(y.shape)} must be {(n, c, 1, 1)}")
    block_c = min(64, triton.next_power_of_2(c))
    while block_c > 16 and n * triton.cdiv(c, block_c) < programs:  # narrower channel blocks: more programs
        block_c //= 2
    _mean_pixels[(n, triton.cdiv(c, block_c))](x, y, c, hw, 1.0 / hw, x.stride(0), x.stride(1), pixel_stride(x), y.stride(0),
                                                y.stride(1), BLOCK_R=64, BLOCK_C=block_c, num_warps=4)  # fmt: skip
    return y


def lower_global_avg_pool(node: Any, graph: Any, backend: str, options: Any = None) -> Any:
    """A Step for ``adaptive_avg_pool2d(x, 1)`` in an NHWC graph (``fuse_pointwise`` leaves those to it); on a GPU
    only where timed faster than PyTorch's, on the channels-last input it runs on."""
    if tuple(node.attrs.get("output_size", ())) != (1, 1):
        return None
    from kfuse.passes.layout import runs_nhwc

    return measured_step(node, graph, backend, lambda xs: global_avg_pool(xs[0]), "global_pool", "mean over H x W",
                         channels_last=runs_nhwc(graph))  # fmt: skip
