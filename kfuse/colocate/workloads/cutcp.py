"""cutcp (Parboil): cutoff Coulomb potential on a 3-D lattice,
V(p) = sum over atoms with r < c of q / r * (1 - r^2 / c^2)^2.

A block is BLOCK lattice points; it scans the atom list in chunks of AC (Parboil bins atoms
spatially to skip far ones; this version masks them, which keeps it compute-heavy).

Block grain: a BE block must be shorter than the LC kernels it is fused into (BERT-base's GEMMs:
10-29 us). Through session 10 a block was 128 points x 4096 atoms and ran ~380 us (715 ns a block
over 528 programs), so Aker found no slice to fuse and delegated to time sharing. Since then a block
is 32 points x 384 atoms (~9 us predicted, 42x less work) on a 128 x 128 x 96 lattice (h = 0.25), so
the kernel still runs a few hundred us.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.colocate.ptb import BlockKernel, interpreting
from kfuse.colocate.workloads import Workload, nan_fill


@triton.jit
def cutcp_block(bid, atoms, out, n_atoms, gx, gy, gz, h, cutoff2, BLOCK: tl.constexpr, AC: tl.constexpr):
    offs = bid * BLOCK + tl.arange(0, BLOCK)
    n = gx * gy * gz
    m = offs < n
    px = (offs % gx).to(tl.float32) * h
    py = ((offs // gx) % gy).to(tl.float32) * h
    pz = (offs // (gx * gy)).to(tl.float32) * h
    inv_c2 = 1.0 / cutoff2
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for a0 in range(0, n_atoms, AC):
        ao = a0 + tl.arange(0, AC)
        am = ao < n_atoms
        ax = tl.load(atoms + 4 * ao, mask=am, other=1e6)
        ay = tl.load(atoms + 4 * ao + 1, mask=am, other=1e6)
        az = tl.load(atoms + 4 * ao + 2, mask=am, other=1e6)
        aq = tl.load(atoms + 4 * ao + 3, mask=am, other=0.0)
        dx = px[:, None] - ax[None, :]
        dy = py[:, None] - ay[None, :]
        dz = pz[:, None] - az[None, :]
        r2 = dx * dx + dy * dy + dz * dz
        inside = (r2 < cutoff2) & (r2 > 0.0)
        s = 1.0 - r2 * inv_c2
        e = aq[None, :] * s * s / tl.sqrt(tl.where(inside, r2, 1.0))
        acc += tl.sum(tl.where(inside, e, 0.0), axis=1)
    tl.store(out + offs, acc, mask=m)


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    (gx, gy, gz), n_atoms = ((7, 6, 5), 41) if small else ((128, 128, 96), 384)
    block, ac = (16, 16) if small or interpreting() else (32, 32)
    h, cutoff = (0.5, 4.0) if small else (0.25, 4.0)
    ext = torch.tensor([gx, gy, gz], dtype=torch.float32) * h
    atoms = torch.cat([torch.rand(n_atoms, 3, generator=g) * ext, torch.randn(n_atoms, 1, generator=g)], 1).to(device).contiguous()
    out = torch.empty(gx * gy * gz, device=device)

    def reference() -> torch.Tensor:
        idx = torch.arange(gx * gy * gz, device=device)
        p = torch.stack([idx % gx, (idx // gx) % gy, idx // (gx * gy)], 1).double() * h
        d2 = ((p[:, None, :] - atoms[None, :, :3].double()) ** 2).sum(-1)
        inside = (d2 < cutoff**2) & (d2 > 0)
        s = 1.0 - d2 / cutoff**2
        e = atoms[None, :, 3].double() * s * s / torch.sqrt(torch.where(inside, d2, torch.ones_like(d2)))
        return torch.where(inside, e, torch.zeros_like(e)).sum(1)

    nb = triton.cdiv(gx * gy * gz, block)
    kern = BlockKernel(
        "cutcp", __name__, "cutcp_block", [atoms, out, n_atoms, gx, gy, gz, h, cutoff * cutoff], {"BLOCK": block, "AC": ac}, nb,
        num_warps=4, flops_per_block=18.0 * block * n_atoms, bytes_per_block=4.0 * block + 16.0 * n_atoms,
    )  # fmt: skip
    return Workload("cutcp", kern, reference, lambda: out, lambda: nan_fill(out), "compute", tol=1e-4)
