"""A weight into L2 before a kernel waits for the previous one (programmatic dependent launch).

Under PDL a kernel's programs become resident while the previous kernel still runs and wait at
``griddepcontrol.wait`` (``kfuse.kernels.pdl``). A GEMM's weight is a constant that no kernel writes, so a program
may read it before that wait: here it issues one ``prefetch.global.L2`` per 128-byte line of the weight slab it is
about to stream, and the slab comes from HBM while the previous kernel (an attention, a norm, a cache write: a
decode step's small kernels, which leave the bandwidth idle) finishes. The main loop then reads L2. L2 is the
point of coherence of global memory, so a prefetch never makes a later load stale; it only moves bytes early.

``slab_plan`` gives the constexprs of ``prefetch_slab`` for a weight's layout: one point a line along its
contiguous dim (N for a row-major ``[K, N]`` weight, K for nn.Linear's transposed view).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels.codegen import interpreting

LINE = 128  # bytes of an L2 line


@triton.jit
def prefetch_l2(ptrs, mask):
    # one prefetch.global.L2 a lane where ``mask`` (the dummy result keeps the asm from being dropped)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def prefetch_slab(b_ptr, n0, N, k_lo, k_hi, stride_bk, stride_bn,
                  PF_K: tl.constexpr, PF_N: tl.constexpr, SK: tl.constexpr, SN: tl.constexpr):  # fmt: skip
    # the (k_hi - k_lo, columns from n0) slab of the weight into L2, a point per line (SK, SN: sampling steps)
    ks = k_lo + tl.arange(0, PF_K) * SK
    ns = n0 + tl.arange(0, PF_N) * SN
    prefetch_l2(b_ptr + ks[:, None] * stride_bk + ns[None, :] * stride_bn, (ks < k_hi)[:, None] & (ns < N)[None, :])


def prefetch_wanted(options: Any) -> bool:
    """``Options.skinny_prefetch`` (on where there are no options)."""
    return bool(getattr(options, "skinny_prefetch", True))


def slab_plan(b: torch.Tensor, block_n: int, rows: int, enabled: bool = True) -> dict[str, Any]:
    """The constexprs of ``prefetch_slab`` (``PREFETCH``, ``PF_K``, ``SK``, ``PF_N``, ``SN``) for slabs of ``rows`` K
    values x ``block_n`` columns of ``b`` ``[K, N]`` (any strides); ``PREFETCH`` False where not ``enabled`` or in
    the interpreter (no inline asm there)."""
    per_line = max(1, LINE // b.element_size())
    k_points = triton.next_power_of_2(max(1, rows))
    if b.stride(0) == 1 and b.stride(1) != 1:  # K contiguous: each column's K slice in lines
        plan = {"PF_K": max(1, k_points // per_line), "SK": per_line, "PF_N": block_n, "SN": 1}
    else:  # N contiguous: each row's columns in lines
        plan = {"PF_K": k_points, "SK": 1, "PF_N": max(1, block_n // per_line), "SN": per_line}
    return {"PREFETCH": enabled and not interpreting(), **plan}
