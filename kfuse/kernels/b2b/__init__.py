"""Back-to-back (persistent) GEMM / Conv chains in one kernel (Bolt's persistent kernel fusion).

A chain is ``stage 0 -> stage 1 -> ... -> stage L-1``. Stage 0 is a GEMM ``x (M, K0) @ W0`` or an
implicit-GEMM convolution (any KxK, stride, padding, on an (N, C, H, W) input of any memory
format; M = N*OH*OW output pixels). Every later stage is a GEMM whose K is the previous stage's
N (a Linear, or a 1x1 / stride-1 / unpadded convolution, which is the same GEMM on the pixel
rows). Each stage has its own generated epilogue (``Epilogue``: bias, activation, residual...).

Threadblock residence: a program owns BLOCK_M rows and computes the *whole* width N_l of every
intermediate stage (padded to a power of two >= 16), so stage l+1 can start from stage l's tile
without any other program's data. The intermediate tile is rounded to the intermediate's dtype
(as the unfused graph would store it), its padded columns are zeroed, and it is fed to the next
``tl.dot`` directly. Only the last stage is stored to global memory (``tests/kernels/test_b2b.py``
checks the compiled sm_90 PTX: exactly one global store instruction per kernel).

Where the intermediate lives between the two ``tl.dot`` calls is decided by the tiling, as in
CUTLASS's b2b example, and is a template parameter here (``residence``):

* ``"register"`` (RF-resident): the warps of a program are stacked along M only (the M tile is
  ``16 * num_warps`` rows on mma.sync, one 64-row warpgroup per 4 warps on wgmma), so each warp
  already holds complete rows of the GEMM0 accumulator, which are exactly the A-operand rows it
  needs for GEMM1. Triton converts the accumulator layout to the dot-operand layout in registers
  (on sm_90 the second product is a register-A ``wgmma ... {%r..}`` instruction) - no shared
  memory traffic for the intermediate.
* ``"smem"`` (shared-memory-resident): the intermediate is written to shared memory and GEMM1
  reads it from there (``st.shared`` of the tile, then a shared-memory-descriptor ``wgmma`` /
  ``ldmatrix``). Triton has no explicit shared-memory allocation in the language, so the
  template expresses it as the product in transposed form, ``out^T = W1^T @ h^T``: ``h^T`` is
  the B operand, and B operands of tensor-core MMAs always come from shared memory. This frees
  the intermediate's registers while GEMM1 runs (wide N0, many stages) at the price of a
  round trip through shared memory.

Hopper conv chains also have ``b2b_conv_tma_kernel`` (configs with ``tma`` and a spatial tile
``tile_h``): a program owns a tile_h x (BLOCK_M / tile_h) pixel tile of one image, and stage 0's
A tiles are TMA boxes of the NHWC input shifted by each filter tap (TMA's zero fill of the
out-of-bounds part is the padding), as in CUTLASS's Hopper implicit-GEMM convs; the output
tiles leave by TMA stores. Stride 1, NHWC, 16-byte aligned rows; else ``b2b_kernel`` runs.

The launcher takes torch tensors; ``reference`` is the oracle (stage by stage in fp32, rounding
the intermediates to their dtypes like the unfused graph).
"""

from __future__ import annotations

from kfuse.kernels.b2b.asm import compile_asm, ptx_global_store_bases, ptx_summary
from kfuse.kernels.b2b.chain import MAX_RESIDENT, RESIDENCES, B2BConfig, Chain, Stage, chunked_eligible, chunked_parts, pad_width
from kfuse.kernels.b2b.configs import candidate_configs, chunked_config, default_config
from kfuse.kernels.b2b.launcher import (
    B2BArgs,
    ConvGeom,
    b2b_chain,
    conv_tma_block_k,
    launch,
    pack_first,
    pack_next,
    prepare,
    reference,
)
from kfuse.kernels.b2b.lower import lower_b2b_chain
from kfuse.kernels.b2b.source import kernel_source

__all__ = [
    "MAX_RESIDENT",
    "RESIDENCES",
    "B2BArgs",
    "B2BConfig",
    "Chain",
    "ConvGeom",
    "Stage",
    "b2b_chain",
    "candidate_configs",
    "chunked_config",
    "chunked_eligible",
    "chunked_parts",
    "compile_asm",
    "conv_tma_block_k",
    "default_config",
    "kernel_source",
    "launch",
    "lower_b2b_chain",
    "pack_first",
    "pack_next",
    "pad_width",
    "prepare",
    "ptx_global_store_bases",
    "ptx_summary",
    "reference",
]
