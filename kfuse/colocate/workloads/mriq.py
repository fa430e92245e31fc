"""mri-q (Parboil): Q = sum_k |phi_k|^2 * exp(i 2 pi k.x) for every voxel x (real and imaginary parts).

A block is BLOCK voxels; it loops over the k-space samples in chunks of KC.

Block grain: a BE block must be shorter than the LC kernels it is fused into (BERT-base's GEMMs:
10-29 us). Through session 10 a block was 128 voxels x 2048 samples (3.8 ms for 2048 blocks at two
programs per SM: ~1 ms a block). Since then a block is 32 voxels x 64 samples (128x less work, ~8 us
predicted) over 2^20 voxels, so the kernel still runs a few hundred us.

Trigonometry (session 18): the arguments stay within [-4.8, 4.8] (k and x are drawn in [-0.5, 0.5]),
so on the GPU ``FAST_TRIG`` computes sin and cos as one MUFU op each (``libdevice.fast_sinf`` /
``fast_cosf``: ``sin.approx.f32``, absolute error < 1e-6 on this range) instead of libdevice's full
range reduction (FMA polynomials and a local-memory slow path). Beside a wgmma GEMM, MUFU work runs
free and FMA work does not (docs/colocate.md, "Session 18"). Measured in session 19: the kernel
13x faster solo (0.275 against 3.7 ms), fused overlap beside BERT-base's GEMMs 25-31%, but only +1.9%
over time sharing, which runs the faster kernel too (docs/colocate.md, "Session 19").
The interpreter has no ``fast_sinf``: the CPU path keeps ``tl.sin`` / ``tl.cos``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from kfuse.colocate.ptb import BlockKernel, interpreting
from kfuse.colocate.workloads import Workload, nan_fill


@triton.jit
def mriq_block(bid, kx, ky, kz, phimag, x, y, z, qr, qi, num_k, num_x, BLOCK: tl.constexpr, KC: tl.constexpr,
               FAST_TRIG: tl.constexpr):  # fmt: skip
    offs = bid * BLOCK + tl.arange(0, BLOCK)
    m = offs < num_x
    px = tl.load(x + offs, mask=m, other=0.0)
    py = tl.load(y + offs, mask=m, other=0.0)
    pz = tl.load(z + offs, mask=m, other=0.0)
    acc_r = tl.zeros((BLOCK,), dtype=tl.float32)
    acc_i = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, num_k, KC):
        ko = k0 + tl.arange(0, KC)
        km = ko < num_k
        ax = tl.load(kx + ko, mask=km, other=0.0)
        ay = tl.load(ky + ko, mask=km, other=0.0)
        az = tl.load(kz + ko, mask=km, other=0.0)
        ph = tl.load(phimag + ko, mask=km, other=0.0)
        arg = 6.283185307179586 * (ax[None, :] * px[:, None] + ay[None, :] * py[:, None] + az[None, :] * pz[:, None])
        if FAST_TRIG:
            cos_arg = libdevice.fast_cosf(arg)
            sin_arg = libdevice.fast_sinf(arg)
        else:
            cos_arg = tl.cos(arg)
            sin_arg = tl.sin(arg)
        acc_r += tl.sum(ph[None, :] * cos_arg, axis=1)
        acc_i += tl.sum(ph[None, :] * sin_arg, axis=1)
    tl.store(qr + offs, acc_r, mask=m)
    tl.store(qi + offs, acc_i, mask=m)


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    num_k, num_x = (37, 53) if small else (64, 1 << 20)
    block, kc = (16, 16) if small or interpreting() else (32, 32)
    ks = [(torch.rand(num_k, generator=g) - 0.5).to(device) for _ in range(3)]
    phi = torch.rand(num_k, generator=g).to(device)
    xs = [(torch.rand(num_x, generator=g) - 0.5).to(device) for _ in range(3)]
    q = torch.empty(2, num_x, device=device)

    def reference() -> torch.Tensor:
        arg = 2 * math.pi * sum(k.double()[None, :] * p.double()[:, None] for k, p in zip(ks, xs, strict=True))
        return torch.stack([(phi.double() * torch.cos(arg)).sum(1), (phi.double() * torch.sin(arg)).sum(1)])

    nb = triton.cdiv(num_x, block)
    consts = {"BLOCK": block, "KC": kc, "FAST_TRIG": not interpreting()}
    kern = BlockKernel(
        "mriq", __name__, "mriq_block", [*ks, phi, *xs, q[0], q[1], num_k, num_x], consts, nb,
        num_warps=4, flops_per_block=14.0 * block * num_k, bytes_per_block=20.0 * block + 16.0 * num_k,
    )  # fmt: skip
    return Workload("mriq", kern, reference, lambda: q, lambda: nan_fill(q), "compute", tol=1e-4)
