"""Analysis step of the triangular solve (cuSPARSE's "analysis" phase): levels, order, tiling.

* Levels are computed on the device by a sync-free kernel of the same shape as the solve
  (level(i) = 1 + max level of its dependencies; the level array doubles as the done flag).
* Rows are renumbered in level order (stable): any topological order is a legal ticket order
  for the sync-free solve, and level order keeps every row of the current wavefront inside
  the window of resident programs. In natural order a 2D/3D Laplacian's wavefront is spread
  over the whole matrix and only ~#resident-programs rows can be in flight.
* Tiling and kernel choice (measured on the H200, docs/sparse.md "Round 2"): the matrix falls in
  one of three regimes by its off-diagonal row lengths and its level count (:class:`RowStats`):
  ``short`` rows on a wide matrix (Laplacian-like) get one-warp 8x4 tiles and the value-flag
  kernel; ``long`` rows (power-law) the row-length tiling (:func:`row_length_tiling`) and the
  value-flag kernel with 2 programs per SM; ``narrow`` matrices (chains, bands: a few rows per
  level) keep the row-length tiling and the original kernel, the only one measured on them.
* :func:`row_length_tiling` (the heuristic of the first two GPU runs, also the level kernel's
  tiling): lanes per row (W) from the row-length distribution, rows per program (R) so that a
  program holds about 128 nonzeros: "warp-per-row"-like tiles for short rows, one wide row
  per program ("block-per-row") when rows are long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from kfuse.runtime.device import on_device
from kfuse.sparse.inputs import TriangularCSR
from kfuse.sparse.sync import acquire_fence, hw_fence_enabled, wait_flags
from kfuse.sparse.variants import DEFAULT, DEFAULT_LONG_ROWS, LEGACY, SyncOptions

MAX_RHS_PER_LAUNCH = 16


@dataclass(frozen=True)
class Tiling:
    rows_per_program: int  # R
    lanes_per_row: int  # W
    num_warps: int

    @property
    def mode(self) -> str:
        return "block-per-row" if self.rows_per_program == 1 else "warp-per-row"


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


SHORT_ROWS = 4.0  # off-diagonal row length: p90 and mean at or below -> "short" (Laplacians: p90 2-3)
NARROW_ROWS_PER_LEVEL = 4.0  # mean rows per level below -> "narrow" (chains and bands: 1)
SHORT_ROW_TILING = Tiling(8, 4, 1)  # one warp: 7 barriers instead of ~40, 8x8 in-tile block


@dataclass(frozen=True)
class RowStats:
    """What the tiling and kernel choice look at: off-diagonal row lengths and the level count."""

    rows: int
    p90: float  # 90th percentile of off-diagonal row lengths
    mean: float
    levels: int | None = None  # None before the level analysis: the matrix counts as wide

    @property
    def rows_per_level(self) -> float | None:
        return self.rows / self.levels if self.levels else None

    @property
    def regime(self) -> str:
        """``"narrow"`` (a few rows per level), ``"short"`` (short rows), else ``"long"``."""
        rpl = self.rows_per_level
        if rpl is not None and rpl < NARROW_ROWS_PER_LEVEL:
            return "narrow"
        return "short" if self.p90 <= SHORT_ROWS and self.mean <= SHORT_ROWS else "long"


def row_stats(row_lengths: torch.Tensor, num_levels: int | None = None) -> RowStats:
    """p90 and mean of the off-diagonal row lengths (and the level count, once known)."""
    n = row_lengths.numel()
    if n == 0:
        return RowStats(0, 0.0, 0.0, num_levels)
    lens = row_lengths.to(torch.float64)
    p90 = float(torch.quantile(lens[: 1 << 24], 0.9)) if n > 1 else float(lens[0])
    return RowStats(n, p90, float(lens.mean()), num_levels)


def row_length_tiling(row_lengths: torch.Tensor | RowStats, nrhs_pad: int = 1) -> Tiling:
    """Pick (R, W, warps) from off-diagonal row lengths; ~128 nonzero lanes per program.

    The heuristic of the first two GPU runs; the level kernel always uses it.
    """
    st = row_lengths if isinstance(row_lengths, RowStats) else row_stats(row_lengths)
    if st.rows == 0:
        return Tiling(1, 2, 1)
    if st.mean > 48:  # long rows: a whole program sweeps one row in wide chunks
        return Tiling(1, 256, 4)
    w = min(64, max(2, _pow2_ceil(math.ceil(st.p90))))
    return _fit(min(32, max(1, 128 // w)), w, nrhs_pad)


def _fit(r: int, w: int, nrhs_pad: int) -> Tiling:
    while r > 1 and r * w * nrhs_pad > 1024:  # keep the [R, W, K] gather within registers
        r //= 2
    lanes = r * w * nrhs_pad
    warps = 4 if lanes >= 512 else 2 if lanes >= 128 else 1
    return Tiling(r, w, warps)


def choose_tiling(row_lengths: torch.Tensor | RowStats, nrhs_pad: int = 1, num_levels: int | None = None) -> Tiling:
    """The solve's tiling: one-warp 8x4 tiles for short rows on a wide matrix, else the row-length tiling.

    ``row_lengths`` are the off-diagonal row lengths (or their :class:`RowStats`); without a
    level count the matrix counts as wide.
    """
    st = row_lengths if isinstance(row_lengths, RowStats) else row_stats(row_lengths, num_levels)
    if num_levels is not None:
        st = replace(st, levels=num_levels)
    if st.rows and st.regime == "short":
        t = SHORT_ROW_TILING
        return _fit(t.rows_per_program, t.lanes_per_row, nrhs_pad) if nrhs_pad > 1 else t
    return row_length_tiling(st, nrhs_pad)


def choose_sync(stats: RowStats) -> SyncOptions:
    """The kernel variant: value flags (2 programs per SM for long rows), the original kernel when narrow."""
    regime = stats.regime
    return LEGACY if regime == "narrow" else DEFAULT_LONG_ROWS if regime == "long" else DEFAULT


@triton.jit
def _levels_kernel(rowptr, cols, lev_ptr, ticket_ptr, n, R: tl.constexpr, W: tl.constexpr, HW_FENCE: tl.constexpr):
    # dynamic tile id: tickets are taken in order by programs that are already running, so a
    # program only ever waits on tiles owned by resident programs (forward progress).
    t = tl.atomic_add(ticket_ptr, 1)
    base = t * R
    r = tl.arange(0, R)
    pos = base + r
    rmask = pos < n
    start = tl.load(rowptr + pos, mask=rmask, other=0)
    end = tl.load(rowptr + pos + 1, mask=rmask, other=0)
    w = tl.arange(0, W)
    q = tl.arange(0, R)
    ext_max = tl.zeros([R], dtype=tl.int32)
    pat = tl.zeros([R, R], dtype=tl.int32)
    nlen = tl.max(end - start)
    for off in range(0, nlen, W):
        idx = start[:, None] + off + w[None, :]
        m = idx < end[:, None]
        c = tl.load(cols + idx, mask=m, other=0)
        ext = m & (c < base)
        wait_flags(lev_ptr, c, ext, 1, 0, HW_FENCE)  # level 0 = not done yet
        tok = acquire_fence(off, HW_FENCE)
        lv = tl.load(lev_ptr + c + (tok - off), mask=ext, other=0, volatile=True)
        ext_max = tl.maximum(ext_max, tl.max(lv, axis=1))
        hit = (m & (c >= base))[:, :, None] & ((c - base)[:, :, None] == q[None, None, :])
        pat = tl.maximum(pat, tl.max(hit.to(tl.int32), axis=1))
    lv = ext_max + 1
    # dependencies inside the tile: iterate to the fixed point (at most R rounds)
    changed = tl.sum(pat)
    while changed > 0:
        new = tl.maximum(ext_max, tl.max(tl.where(pat > 0, lv[None, :], 0), axis=1)) + 1
        changed = tl.sum((new != lv).to(tl.int32))
        lv = new
    tl.atomic_xchg(lev_ptr + pos, lv, mask=rmask, sem="release", scope="gpu")


def compute_levels(tri: TriangularCSR, tiling: Tiling) -> torch.Tensor:
    """Level of every canonical row (1 = no dependencies), int32 [n]."""
    n = tri.n
    lev = torch.zeros(n, dtype=torch.int32, device=tri.device)
    if n == 0:
        return lev
    ticket = torch.zeros(1, dtype=torch.int32, device=tri.device)
    r, w = tiling.rows_per_program, tiling.lanes_per_row
    grid = (triton.cdiv(n, r),)
    with on_device(tri.device):  # Triton launches on the current GPU, not on the tensors' (a matrix on cuda:1)
        _levels_kernel[grid](
            tri.rowptr.to(torch.int32),
            tri.cols.to(torch.int32),
            lev,
            ticket,
            n,
            R=r,
            W=w,
            HW_FENCE=hw_fence_enabled(tri.device),
            num_warps=tiling.num_warps,
        )
    return lev


@dataclass(frozen=True)
class LevelOrdered:
    """The canonical system renumbered in level order (positions); int32 index arrays."""

    rowptr: torch.Tensor  # int32 [n+1]
    cols: torch.Tensor  # int32 [nnz_off], positions
    vals: torch.Tensor
    diag: torch.Tensor  # [n], position order
    perm: torch.Tensor  # int32 [n]: position -> original row
    levels: torch.Tensor  # int32 [n], non-decreasing in position
    level_ptr: list[int]  # positions where each level starts (len = num_levels + 1)


def level_order(tri: TriangularCSR, lev: torch.Tensor) -> LevelOrdered:
    """Stable sort of the canonical rows by level; columns renamed to positions."""
    n, dev = tri.n, tri.device
    pos_to_row = torch.argsort(lev, stable=True)
    row_to_pos = torch.empty_like(pos_to_row)
    row_to_pos[pos_to_row] = torch.arange(n, device=dev)
    lengths = tri.rowptr[1:] - tri.rowptr[:-1]
    new_len = lengths[pos_to_row]
    rowptr = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    rowptr[1:] = torch.cumsum(new_len, 0)
    nnz = int(rowptr[-1]) if n else 0
    # source index of every entry of the renumbered matrix
    seg_start = torch.repeat_interleave(tri.rowptr[:-1][pos_to_row], new_len)
    within = torch.arange(nnz, device=dev) - torch.repeat_interleave(rowptr[:-1], new_len)
    src = seg_start + within
    lev_sorted = lev[pos_to_row]
    counts = torch.bincount(lev_sorted.to(torch.int64), minlength=1)[1:] if n else torch.zeros(0, dtype=torch.int64)
    level_ptr = [0] + torch.cumsum(counts, 0).tolist()
    return LevelOrdered(
        rowptr=rowptr.to(torch.int32),
        cols=row_to_pos[tri.cols[src]].to(torch.int32),
        vals=tri.vals[src].contiguous(),
        diag=tri.diag[pos_to_row].contiguous(),
        perm=tri.order[pos_to_row].to(torch.int32),
        levels=lev_sorted.contiguous(),
        level_ptr=level_ptr,
    )


def mixed_tiles(rowptr: torch.Tensor, n: int, r: int, long_row_min: int) -> torch.Tensor:
    """Tile boundaries of the mixed tiling: int32 ``tile_ptr`` [T+1], tile t = positions [ptr[t], ptr[t+1]).

    Positions are in level order, and the tiles are contiguous, increasing position ranges, so a
    tile only depends on tiles with a smaller index (= smaller ticket): the ticket protocol holds
    unchanged. A row with more than ``long_row_min`` off-diagonal nonzeros is a tile of its own
    (kind "long": the kernel recognises it as a one-row tile whose row is longer than the
    threshold). The short rows between two long ones are cut into tiles of up to ``r`` rows, from
    the first short row on; such a run may span levels (solved in the tile, as before).
    """
    dev = rowptr.device
    if n == 0:
        return torch.zeros(1, dtype=torch.int32, device=dev)
    lens = (rowptr[1 : n + 1] - rowptr[:n]).to(torch.int64)
    long = lens > long_row_min
    p = torch.arange(n, device=dev)
    prev_long = torch.zeros(n, dtype=torch.bool, device=dev)
    prev_long[1:] = long[:-1]
    run_head = torch.where((p == 0) | prev_long, p, torch.zeros_like(p))  # first row of a short run
    run_start = torch.cummax(run_head, 0).values
    starts = long | ((p - run_start) % r == 0)
    ptr = torch.nonzero(starts).flatten()
    return torch.cat([ptr, torch.tensor([n], device=dev)]).to(torch.int32)


def tile_kinds(tile_ptr: torch.Tensor, rowptr: torch.Tensor, long_row_min: int) -> torch.Tensor:
    """Per tile: 1 = long (one row above the threshold, swept by the whole program), 0 = packed short rows."""
    first = tile_ptr[:-1].to(torch.int64)
    one = (tile_ptr[1:] - tile_ptr[:-1]) == 1
    return (one & ((rowptr[first + 1] - rowptr[first]) > long_row_min)).to(torch.int32)
