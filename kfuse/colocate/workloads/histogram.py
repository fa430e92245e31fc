"""histogram (Parboil/Rodinia style): counts of 8-bit values into 256 bins.

A block histograms BLOCK inputs in registers (``tl.histogram``) and adds them to the global
counts with one atomic per bin, so any block range adds its share: splits sum to the whole.
Out-of-range lanes are sent to a spill bin above 255 that is never written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.colocate.ptb import BlockKernel, interpreting
from kfuse.colocate.workloads import Workload


@triton.jit
def histogram_block(bid, data, hist, n, BLOCK: tl.constexpr, NBINS: tl.constexpr):
    offs = bid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.where(m, tl.load(data + offs, mask=m, other=0).to(tl.int32), NBINS)  # spill bin (uint8 cannot hold 256)
    h = tl.histogram(v, 2 * NBINS)
    bins = tl.arange(0, 2 * NBINS)
    tl.atomic_add(hist + bins, h, mask=bins < NBINS, sem="relaxed")


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    n = 1000 if small else 64 * 1024 * 1024
    block = 128 if interpreting() else 4096
    # a skewed distribution (as in image histograms): many lanes hit the same bins
    data = (torch.randn(n, generator=g).abs() * 40).clamp(max=255).to(torch.uint8).to(device)
    hist = torch.empty(256, dtype=torch.int32, device=device)
    nb = triton.cdiv(n, block)
    kern = BlockKernel(
        "histogram", __name__, "histogram_block", [data, hist, n], {"BLOCK": block, "NBINS": 256}, nb, num_warps=4,
        flops_per_block=2.0 * block, bytes_per_block=1.0 * block + 256 * 4,
    )  # fmt: skip

    def reference() -> torch.Tensor:
        return torch.bincount(data.long(), minlength=256).to(torch.int32)

    return Workload("histogram", kern, reference, lambda: hist, hist.zero_, "neutral", tol=0.0)
