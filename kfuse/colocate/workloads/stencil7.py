"""stencil (Parboil): one Jacobi step of the 3-D 7-point stencil; boundary points are copied.

A block is a BY x BX tile of one z-plane.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.colocate.ptb import BlockKernel, interpreting
from kfuse.colocate.workloads import Workload, nan_fill


@triton.jit
def stencil7_block(bid, src, dst, nx, ny, nz, c0, c1, BY: tl.constexpr, BX: tl.constexpr):
    tiles_x = tl.cdiv(nx, BX)
    tiles_y = tl.cdiv(ny, BY)
    tx = bid % tiles_x
    t = bid // tiles_x
    ty = t % tiles_y
    z = t // tiles_y
    y = ty * BY + tl.arange(0, BY)[:, None]
    x = tx * BX + tl.arange(0, BX)[None, :]
    inb = (y < ny) & (x < nx)
    plane = nx * ny
    idx = z * plane + y * nx + x
    c = tl.load(src + idx, mask=inb, other=0.0)
    inner = inb & (x > 0) & (x < nx - 1) & (y > 0) & (y < ny - 1) & (z > 0) & (z < nz - 1)
    s = tl.load(src + idx - 1, mask=inner, other=0.0) + tl.load(src + idx + 1, mask=inner, other=0.0)
    s += tl.load(src + idx - nx, mask=inner, other=0.0) + tl.load(src + idx + nx, mask=inner, other=0.0)
    s += tl.load(src + idx - plane, mask=inner, other=0.0) + tl.load(src + idx + plane, mask=inner, other=0.0)
    tl.store(dst + idx, tl.where(inner, c0 * c + c1 * s, c), mask=inb)


def reference(src: torch.Tensor, c0: float, c1: float) -> torch.Tensor:
    s = src.double()
    out = s.clone()
    i = s[1:-1, 1:-1, 1:-1]
    nb = s[:-2, 1:-1, 1:-1] + s[2:, 1:-1, 1:-1] + s[1:-1, :-2, 1:-1] + s[1:-1, 2:, 1:-1] + s[1:-1, 1:-1, :-2] + s[1:-1, 1:-1, 2:]
    out[1:-1, 1:-1, 1:-1] = c0 * i + c1 * nb
    return out


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    nz, ny, nx = (5, 11, 13) if small else (256, 256, 256)
    by, bx = (4, 8) if small or interpreting() else (8, 64)
    src = torch.randn(nz, ny, nx, generator=g).to(device)
    dst = torch.empty_like(src)
    c0, c1 = 1.0 / 6.0, 1.0 / 6.0 / 6.0
    nb = nz * triton.cdiv(ny, by) * triton.cdiv(nx, bx)
    kern = BlockKernel(
        "stencil7", __name__, "stencil7_block", [src, dst, nx, ny, nz, c0, c1], {"BY": by, "BX": bx}, nb, num_warps=4,
        flops_per_block=8.0 * by * bx, bytes_per_block=8.0 * by * bx,
    )  # fmt: skip
    return Workload("stencil7", kern, lambda: reference(src, c0, c1), lambda: dst, lambda: nan_fill(dst), "memory")
