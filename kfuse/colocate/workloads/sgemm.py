"""sgemm (Parboil): C = A @ B in fp32 on CUDA cores.

It reuses the PTB GEMM block function with ``input_precision="ieee"``: an fp32 ``tl.dot`` that
must be exact fp32 cannot use tensor cores (they take tf32/fp16/bf16/fp8 inputs), so Triton
lowers it to FMA instructions on the CUDA cores. With ``"tf32"`` the same dot would go to the
tensor cores, which is why LC GEMMs (fp16) and this kernel use different units of the SM.

Block grain: Aker fuses a BE *slice* into one LC kernel, so a BE block must be shorter than the LC
kernels (BERT-base's GEMMs: 10-29 us on the H200). Through session 10 this was 2048 x 2048 x 512:
each 64x64 block ran ~54 us on four programs per SM (0.115 ms for two waves), and Aker fused 3 slices
in 29,847 tries. Since then K = 64 (a block is 8x shorter, ~7 us predicted) and M = N = 8192 keep
the kernel at a few hundred us.
"""

from __future__ import annotations

import torch

from kfuse.colocate.ptb import PtbGemmConfig, gemm_kernel, interpreting
from kfuse.colocate.workloads import Workload, nan_fill


def make(small: bool, device: torch.device, g: torch.Generator) -> Workload:
    m, n, k = (37, 45, 29) if small else (8192, 8192, 64)
    a = torch.randn(m, k, generator=g).to(device)
    b = torch.randn(k, n, generator=g).to(device)
    c = torch.empty(m, n, device=device)
    cfg = PtbGemmConfig(16, 16, 16, 2, 4, 1) if small or interpreting() else PtbGemmConfig(64, 64, 16, 8, 4, 2)
    kern = gemm_kernel(a, b, c, cfg, precision="ieee", name="sgemm")
    return Workload("sgemm", kern, lambda: a.double() @ b.double(), lambda: c, lambda: nan_fill(c), "compute", tol=1e-5)
