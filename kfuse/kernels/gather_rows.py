"""Row gather: ``y[r, :] = x[index[r], :]`` over the last dim, one launch.

A chain of reshapes, permutes, slices, cats and rolls that keeps the feature dim whole only reorders
rows (Swin's shifted-window partition: roll, view, permute, contiguous). PyTorch runs it as a copy a
step (Swin-T: two cats for the roll, one copy for the permute); as a gather it is one read and one
write of the tensor plus four bytes of index a row (``kfuse.passes.gather_rows``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels import pdl
from kfuse.kernels.codegen import interpreting
from kfuse.kernels.norm import rows2d
from kfuse.kernels.pdl import pdl_start


@triton.jit
def _gather_rows(
    X, Index, Y, M, N, stride_x, stride_y,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_start(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    src = tl.load(Index + rows, mask=row_ok, other=0).to(tl.int64)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (cols < N)[None, :]
        v = tl.load(X + src[:, None] * stride_x + cols[None, :], mask=mask)
        tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], v, mask=mask)


def launch_config(n: int) -> tuple[int, int, int]:
    """(rows a program, BLOCK_N, warps): about 4096 elements a program, 16-byte fp16 vectors."""
    if interpreting():
        return 4, min(triton.next_power_of_2(n), 64), 1
    block_n = min(triton.next_power_of_2(n), 1024)
    rows = max(1, 4096 // block_n)
    return rows, block_n, 4


def gather_rows(
    x: torch.Tensor, index: torch.Tensor, out_shape: tuple[int, ...] | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x.reshape(-1, N)[index]`` reshaped to ``out_shape`` (default ``(len(index), N)``), ``N = x.shape[-1]``;
    into ``out`` (contiguous, that shape) when given. ``out_shape``'s last dim may be a multiple of ``N``
    (source rows side by side)."""
    n = x.shape[-1]
    shape = tuple(out_shape) if out_shape is not None else (index.numel(), n)
    m = index.numel()
    if shape[-1] % max(n, 1) or m * n != math.prod(shape):
        raise ValueError(f"gather_rows: {m} rows of {n} do not make the output shape {shape}")
    x2, sx = rows2d(x, n, "input")
    if index.dtype not in (torch.int32, torch.int64) or index.dim() != 1:
        raise ValueError(f"gather_rows: index must be a 1-D int32/int64 tensor, got {index.dtype} of rank {index.dim()}")
    if out is not None and (tuple(out.shape) != shape or not out.is_contiguous() or out.dtype != x.dtype or out.device != x.device):
        raise ValueError(f"gather_rows: out must be a contiguous {x.dtype} tensor of shape {shape} on {x.device}")
    y = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    rows, block_n, warps = launch_config(n)
    _gather_rows[(triton.cdiv(m, rows),)](
        x2, index, y, m, n, sx, n,
        ROWS=rows, BLOCK_N=block_n, num_warps=warps, **pdl.launch_kwargs(),
    )  # fmt: skip
    return y


def lower_gather_rows(node: Any, graph: Any, backend: str, options: Any = None) -> Any:
    """A Step running the kernel (the torch backend keeps the op's ``index_select`` reference)."""
    if backend == "torch":
        return None
    from kfuse.runtime.executor import KernelInfo, Step

    shape = tuple(node.ttype.shape)

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        return gather_rows(xs[0], xs[1], shape)

    fused = tuple(node.attrs.get("fused_ops", ("gather_rows",)))
    desc = f"{shape[-1]} features, {math.prod(shape) // max(shape[-1], 1)} rows"
    return Step(node.name, node.inputs, run, KernelInfo(node.name, "gather_rows", fused, desc))
