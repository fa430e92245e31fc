"""histogram (Parboil/Rodinia style): counts of 8-bit values into 256 bins.

A block histograms BLOCK inputs in registers (``tl.histogram``, out-of-range lanes masked) and adds
them to the global counts with one atomic per bin, so any block range adds its share: splits sum to
the whole.

Block grain: ``tl.histogram`` compares every lane with every bin, so a block costs BLOCK x bins.
Session 11 measured blocks of 4096 inputs into 512 bins (256 and a spill bin range for masked lanes)
at ~24 us each on four programs per SM, longer than most of BERT-base's 10-29 us LC GEMMs, and 14,237
slices were refused for headroom. Now 2048 inputs into 256 bins with a mask: ~4x less work a block,
predicted ~6 us, at twice the atomics (8.4 M over the 64 Mi inputs).

Warps: 8, not 4. Session 66 timed the PTB kernel's forms on an H100 (``be_solo_forms.py --warps 4,8,16``): 0.37 ms on
8 warps against 0.78 ms on 4 (2.1x; 16 warps 0.38-0.49), whatever the grid (1-8 programs an SM: 0.78-0.80 ms on 4
warps). The 4-warp kernel had made every time-sharing baseline of histogram twice too slow: the `ws` partition's
8-warp worker "gained" +8..+19% over it and +0.9..+1.6% over the 8-warp kernel; the PTB LC's fused versions +37% and
+4.3% (``benchmarks/results/h100/colocate_s66_*``).
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
    v = tl.load(data + offs, mask=m, other=0).to(tl.int32)
    h = tl.histogram(v, NBINS, mask=m)
    tl.atomic_add(hist + tl.arange(0, NBINS), h, sem="relaxed")


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    n = 1000 if small else 64 * 1024 * 1024
    block = 128 if small or interpreting() else 2048
    # a skewed distribution (as in image histograms): many lanes hit the same bins
    data = (torch.randn(n, generator=g).abs() * 40).clamp(max=255).to(torch.uint8).to(device)
    hist = torch.empty(256, dtype=torch.int32, device=device)
    nb = triton.cdiv(n, block)
    kern = BlockKernel(
        "histogram", __name__, "histogram_block", [data, hist, n], {"BLOCK": block, "NBINS": 256}, nb, num_warps=8,
        flops_per_block=2.0 * block, bytes_per_block=1.0 * block + 256 * 4,
    )  # fmt: skip

    def reference() -> torch.Tensor:
        return torch.bincount(data.long(), minlength=256).to(torch.int32)

    return Workload("histogram", kern, reference, lambda: hist, hist.zero_, "neutral", tol=0.0, idempotent=False)
