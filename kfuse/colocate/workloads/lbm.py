"""lbm (Parboil): one step of the D3Q19 lattice-Boltzmann method, pull streaming + BGK collision,
periodic boundaries. Distributions are stored structure-of-arrays, ``f[q, z, y, x]``.

A block is BLOCK consecutive cells. Pass 1 pulls the 19 populations (``f_q(x - c_q)``) and sums
density and momentum, parking the pulled values in ``dst``; pass 2 relaxes them towards equilibrium.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.colocate.ptb import BlockKernel, interpreting
from kfuse.colocate.workloads import Workload, nan_fill

# D3Q19 velocity set and weights
C = [(0, 0, 0), (1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1),
     (1, 1, 0), (-1, -1, 0), (1, -1, 0), (-1, 1, 0), (1, 0, 1), (-1, 0, -1), (1, 0, -1), (-1, 0, 1),
     (0, 1, 1), (0, -1, -1), (0, 1, -1), (0, -1, 1)]  # fmt: skip
W = [1.0 / 3.0] + [1.0 / 18.0] * 6 + [1.0 / 36.0] * 12


@triton.jit
def lbm_block(bid, src, dst, cvec, wvec, nx, ny, nz, omega, BLOCK: tl.constexpr):
    n = nx * ny * nz
    i = bid * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = i % nx
    y = (i // nx) % ny
    z = i // (nx * ny)
    rho = tl.zeros((BLOCK,), dtype=tl.float32)
    jx = tl.zeros((BLOCK,), dtype=tl.float32)
    jy = tl.zeros((BLOCK,), dtype=tl.float32)
    jz = tl.zeros((BLOCK,), dtype=tl.float32)
    for q in range(19):
        cx = tl.load(cvec + 3 * q)
        cy = tl.load(cvec + 3 * q + 1)
        cz = tl.load(cvec + 3 * q + 2)
        xs = (x - cx + nx) % nx
        ys = (y - cy + ny) % ny
        zs = (z - cz + nz) % nz
        f = tl.load(src + q * n + (zs * ny + ys) * nx + xs, mask=m, other=0.0)
        rho += f
        jx += cx * f
        jy += cy * f
        jz += cz * f
        tl.store(dst + q * n + i, f, mask=m)
    inv = 1.0 / tl.where(m, rho, 1.0)
    ux = jx * inv
    uy = jy * inv
    uz = jz * inv
    usq = 1.5 * (ux * ux + uy * uy + uz * uz)
    for q in range(19):
        cx = tl.load(cvec + 3 * q).to(tl.float32)
        cy = tl.load(cvec + 3 * q + 1).to(tl.float32)
        cz = tl.load(cvec + 3 * q + 2).to(tl.float32)
        w = tl.load(wvec + q)
        f = tl.load(dst + q * n + i, mask=m, other=0.0)
        cu = 3.0 * (cx * ux + cy * uy + cz * uz)
        feq = w * rho * (1.0 + cu + 0.5 * cu * cu - usq)
        tl.store(dst + q * n + i, f - omega * (f - feq), mask=m)


def reference(src: torch.Tensor, omega: float) -> torch.Tensor:
    f = src.double()
    pulled = torch.stack([torch.roll(f[q], shifts=(c[2], c[1], c[0]), dims=(0, 1, 2)) for q, c in enumerate(C)])
    cv = torch.tensor(C, dtype=torch.float64, device=f.device)
    wv = torch.tensor(W, dtype=torch.float64, device=f.device)
    rho = pulled.sum(0)
    u = torch.einsum("qd,qzyx->dzyx", cv, pulled) / rho
    cu = 3.0 * torch.einsum("qd,dzyx->qzyx", cv, u)
    usq = 1.5 * (u * u).sum(0)
    feq = wv[:, None, None, None] * rho * (1.0 + cu + 0.5 * cu * cu - usq)
    return pulled - omega * (pulled - feq)


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    nz, ny, nx = (3, 5, 7) if small else (128, 128, 128)
    block = 32 if small or interpreting() else 256
    # populations near equilibrium at rest, positive so the density never vanishes
    src = (torch.tensor(W)[:, None, None, None] * (1.0 + 0.1 * torch.rand(19, nz, ny, nx, generator=g))).float().to(device)
    dst = torch.empty_like(src)
    cvec = torch.tensor(C, dtype=torch.int32).flatten().to(device)
    wvec = torch.tensor(W, dtype=torch.float32).to(device)
    omega = 1.2
    nb = triton.cdiv(nx * ny * nz, block)
    kern = BlockKernel(
        "lbm", __name__, "lbm_block", [src, dst, cvec, wvec, nx, ny, nz, omega], {"BLOCK": block}, nb, num_warps=4,
        flops_per_block=19 * 20.0 * block, bytes_per_block=19 * 4 * 4.0 * block,
    )  # fmt: skip
    return Workload("lbm", kern, lambda: reference(src, omega), lambda: dst, lambda: nan_fill(dst), "memory", tol=1e-5)
