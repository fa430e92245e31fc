"""Level-set baseline: one kernel launch per dependency level (what sync-free replaces).

Uses the same analysis as the sync-free solve (levels, level-ordered matrix; the tiling is the
level kernel's, i.e. the row-length tiling of the recorded baselines, not the sync-free one); inside
a level all rows are independent, so each launch is a plain gather-multiply-divide over the
rows of that level. The launch count equals the number of levels, which is what dominates
for matrices with thousands of levels.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.sparse.analysis import MAX_RHS_PER_LAUNCH
from kfuse.sparse.inputs import check_rhs
from kfuse.sparse.sptrsv import SptrsvPlan, _finish, _pow2_ceil, _prepare_out


@triton.jit
def _level_kernel(
    rowptr, cols, vals, diag, perm, b_ptr, x_ptr, xp_ptr,
    first, last, nrhs, stride_b, stride_x,
    R: tl.constexpr, W: tl.constexpr, KP: tl.constexpr,
):  # fmt: skip
    pos = first + tl.program_id(0) * R + tl.arange(0, R)
    rmask = pos < last
    start = tl.load(rowptr + pos, mask=rmask, other=0)
    end = tl.load(rowptr + pos + 1, mask=rmask, other=0)
    kk = tl.arange(0, KP)
    kmask = kk < nrhs
    w = tl.arange(0, W)
    acc = tl.zeros([R, KP], dtype=vals.dtype.element_ty)
    nlen = tl.max(end - start)
    for off in range(0, nlen, W):
        idx = start[:, None] + off + w[None, :]
        m = idx < end[:, None]
        c = tl.load(cols + idx, mask=m, other=0)
        v = tl.load(vals + idx, mask=m, other=0.0)
        xg = tl.load(xp_ptr + c[:, :, None] * nrhs + kk[None, None, :], mask=m[:, :, None] & kmask[None, None, :], other=0.0)
        acc += tl.sum(v[:, :, None] * xg, axis=1)
    row = tl.load(perm + pos, mask=rmask, other=0)
    rk = rmask[:, None] & kmask[None, :]
    d = tl.load(diag + pos, mask=rmask, other=1.0)
    xt = (tl.load(b_ptr + row[:, None] * stride_b + kk[None, :], mask=rk, other=0.0) - acc) / d[:, None]
    tl.store(xp_ptr + pos[:, None] * nrhs + kk[None, :], xt, mask=rk)
    tl.store(x_ptr + row[:, None] * stride_x + kk[None, :], xt, mask=rk)


def levelset_solve(plan: SptrsvPlan, b: Any, out: torch.Tensor | None = None) -> Any:
    """x with A x = b by one launch per level (baseline for the sync-free kernel)."""
    b2, was_1d, was_numpy = check_rhs(b, plan.n, plan.dtype, plan.device)
    x = _prepare_out(out, b2)
    k = b2.shape[1]
    lo = plan.lo
    for g0 in range(0, k, MAX_RHS_PER_LAUNCH):
        kg = min(MAX_RHS_PER_LAUNCH, k - g0)
        kp = _pow2_ceil(kg)
        til = plan.tiling_for(kp, plan.level_tiling)
        r = til.rows_per_program
        xp = torch.empty(max(plan.n, 1) * kg, dtype=plan.dtype, device=plan.device)
        for first, last in zip(lo.level_ptr[:-1], lo.level_ptr[1:], strict=True):
            _level_kernel[(triton.cdiv(last - first, r),)](
                lo.rowptr, lo.cols, lo.vals, lo.diag, lo.perm, b2[:, g0:], x[:, g0:], xp,
                first, last, kg, b2.stride(0), x.stride(0),
                R=r, W=til.lanes_per_row, KP=kp, num_warps=til.num_warps,
            )  # fmt: skip
    return _finish(x, out, was_1d, was_numpy)
