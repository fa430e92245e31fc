"""hotspot (Rodinia): one explicit step of the 2-D chip thermal simulation,
T' = T + step/C * (P + (T_n + T_s - 2T) / Ry + (T_e + T_w - 2T) / Rx + (T_amb - T) / Rz),
with neighbours clamped at the chip edge. A block is a BY x BX tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.colocate.ptb import BlockKernel, interpreting
from kfuse.colocate.workloads import Workload, nan_fill


@triton.jit
def hotspot_block(bid, temp, power, out, rows, cols, step_c, rx_1, ry_1, rz_1, amb, BY: tl.constexpr, BX: tl.constexpr):
    tiles_x = tl.cdiv(cols, BX)
    r = (bid // tiles_x) * BY + tl.arange(0, BY)[:, None]
    c = (bid % tiles_x) * BX + tl.arange(0, BX)[None, :]
    m = (r < rows) & (c < cols)
    idx = r * cols + c
    t = tl.load(temp + idx, mask=m, other=0.0)
    p = tl.load(power + idx, mask=m, other=0.0)
    tn = tl.load(temp + tl.maximum(r - 1, 0) * cols + c, mask=m, other=0.0)
    ts = tl.load(temp + tl.minimum(r + 1, rows - 1) * cols + c, mask=m, other=0.0)
    tw = tl.load(temp + r * cols + tl.maximum(c - 1, 0), mask=m, other=0.0)
    te = tl.load(temp + r * cols + tl.minimum(c + 1, cols - 1), mask=m, other=0.0)
    d = step_c * (p + (tn + ts - 2.0 * t) * ry_1 + (te + tw - 2.0 * t) * rx_1 + (amb - t) * rz_1)
    tl.store(out + idx, t + d, mask=m)


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    rows, cols = (13, 19) if small else (4096, 4096)
    by, bx = (4, 8) if small or interpreting() else (16, 64)
    temp = (320.0 + 10 * torch.rand(rows, cols, generator=g)).to(device)
    power = torch.rand(rows, cols, generator=g).to(device)
    out = torch.empty_like(temp)
    step_c, rx_1, ry_1, rz_1, amb = 0.5, 0.1, 0.12, 0.02, 80.0

    def reference() -> torch.Tensor:
        t = temp.double()
        tp = torch.nn.functional.pad(t[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
        tn, ts, tw, te = tp[:-2, 1:-1], tp[2:, 1:-1], tp[1:-1, :-2], tp[1:-1, 2:]
        return t + step_c * (power.double() + (tn + ts - 2 * t) * ry_1 + (te + tw - 2 * t) * rx_1 + (amb - t) * rz_1)

    nb = triton.cdiv(rows, by) * triton.cdiv(cols, bx)
    kern = BlockKernel(
        "hotspot", __name__, "hotspot_block", [temp, power, out, rows, cols, step_c, rx_1, ry_1, rz_1, amb], {"BY": by, "BX": bx}, nb,
        num_warps=4, flops_per_block=15.0 * by * bx, bytes_per_block=12.0 * by * bx,
    )  # fmt: skip
    return Workload("hotspot", kern, reference, lambda: out, lambda: nan_fill(out), "memory", tol=1e-6)
