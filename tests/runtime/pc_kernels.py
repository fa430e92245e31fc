"""A small Triton kernel for the worker-compile tests (a module a fresh process can import)."""

import triton
import triton.language as tl


@triton.jit
def scaled_add(x, y, out, n, alpha, BLOCK: tl.constexpr, ACT: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + i, mask=i < n) * alpha + tl.load(y + i, mask=i < n)
    if ACT == "relu":
        v = tl.maximum(v, 0.0)
    tl.store(out + i, v, mask=i < n)
