"""pathfinder (Rodinia): dynamic programming down a grid of weights,
dst[i] = wall[row, i] + min(src[i-1], src[i], src[i+1]) (neighbours outside the grid ignored).

One launch advances ROWS rows. A block owns W - 2*ROWS output columns and computes a window of
W columns (the pyramid of Rodinia): the halo shrinks by one column per row, so only its centre
is exact and stored. Rows are exchanged between lanes through a per-block scratch line.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.colocate.ptb import BlockKernel, interpreting
from kfuse.colocate.workloads import Workload, nan_fill


@triton.jit
def pathfinder_block(bid, wall, src, dst, scratch, cols, row0, ROWS: tl.constexpr, W: tl.constexpr):
    OUTW: tl.constexpr = W - 2 * ROWS
    big = 1 << 30
    offs = tl.arange(0, W)
    col = bid * OUTW - ROWS + offs
    valid = (col >= 0) & (col < cols)
    cur = tl.load(src + col, mask=valid, other=big)
    line = scratch + bid * W
    for r in range(ROWS):
        tl.store(line + offs, cur)
        tl.debug_barrier()
        left = tl.load(line + offs - 1, mask=offs > 0, other=big)
        right = tl.load(line + offs + 1, mask=offs < W - 1, other=big)
        tl.debug_barrier()
        w = tl.load(wall + (row0 + r) * cols + col, mask=valid, other=0)
        cur = tl.where(valid, tl.minimum(tl.minimum(left, cur), right) + w, big)
    keep = valid & (offs >= ROWS) & (offs < W - ROWS)
    tl.store(dst + col, cur, mask=keep)


def reference(wall: torch.Tensor, src: torch.Tensor, row0: int, rows: int) -> torch.Tensor:
    big = 1 << 30
    cur = src.long()
    for r in range(rows):
        pad = torch.nn.functional.pad(cur[None, None].double(), (1, 1), value=big)[0, 0].long()
        cur = torch.minimum(torch.minimum(pad[:-2], pad[1:-1]), pad[2:]) + wall[row0 + r].long()
    return cur.to(torch.int32)


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    cols, rows = (53, 4) if small else (1 << 22, 16)
    w = 16 if small or interpreting() else 256
    wall = torch.randint(0, 10, (rows + 1, cols), generator=g, dtype=torch.int32).to(device)
    src = wall[0].clone()
    dst = torch.empty(cols, dtype=torch.int32, device=device)
    outw = w - 2 * rows
    nb = triton.cdiv(cols, outw)
    scratch = torch.empty(nb * w, dtype=torch.int32, device=device)
    kern = BlockKernel(
        "pathfinder", __name__, "pathfinder_block", [wall, src, dst, scratch, cols, 1], {"ROWS": rows, "W": w}, nb, num_warps=4,
        flops_per_block=3.0 * w * rows, bytes_per_block=4.0 * w * (rows + 2),
    )  # fmt: skip
    return Workload("pathfinder", kern, lambda: reference(wall, src, 1, rows), lambda: dst, lambda: nan_fill(dst), "neutral", tol=0.0)
