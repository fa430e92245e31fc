"""Sync-free sparse triangular solve: one kernel launch per solve, no level barriers.

Public API: :func:`analyze` (preprocessing, timed) returning a :class:`SptrsvPlan` whose
``solve`` runs the single kernel, and :func:`sptrsv` (analyse + solve in one call).

The kernels (three generations) are in :mod:`kfuse.sparse.kernels`; the plan owns their
workspace (done flags with an epoch number, so successive solves need no reset launch, and the
ticket counter). How a program waits (done flags, acquire polls or value flags), whether it loops
over tickets (persistent grid) and how rows are cut into tiles are the
:class:`~kfuse.sparse.variants.SyncOptions` and tiling of the plan or of one solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import triton

from kfuse.kernels.codegen import interpreting
from kfuse.runtime.device import on_device
from kfuse.sparse.analysis import (
    MAX_RHS_PER_LAUNCH,
    LevelOrdered,
    RowStats,
    Tiling,
    choose_sync,
    choose_tiling,
    compute_levels,
    level_order,
    mixed_tiles,
    row_length_tiling,
    row_stats,
)
from kfuse.sparse.inputs import canonicalize, check_rhs
from kfuse.sparse.kernels import _syncfree_fast_kernel, _syncfree_kernel, _syncfree_mixed_kernel
from kfuse.sparse.sync import hw_fence_enabled
from kfuse.sparse.tiledeps import tile_dependencies
from kfuse.sparse.variants import DEFAULT, SyncOptions, persistent_grid

_INT32_MAX = 2**31 - 1
DEP_LANES = 32  # producing tiles polled at once (tile-flag variant)
# value flags: x (position order) starts as a signalling NaN; arithmetic never yields one (any
# NaN it produces is quiet), so "bits == sentinel" means "not solved yet"
SENTINEL = {torch.float64: 0x7FF4A5A5A5A5A5A5, torch.float32: 0x7FA5A5A5}
_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32}
_FLAG_CODE = {"tile": 0, "row": 1, "value": 2}
MIXED_LONG_ELEMS = 2048  # mixed tiling: long-row lanes x padded RHS per chunk (256 lanes up to 8 RHS)


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@dataclass
class SptrsvPlan:
    """Result of :func:`analyze`: level-ordered matrix, tiling, workspace, timings."""

    n: int
    nnz: int
    dtype: torch.dtype
    device: torch.device
    lower: bool
    unit_diagonal: bool
    num_levels: int
    tiling: Tiling
    lo: LevelOrdered
    preprocess_ms: dict[str, float]
    sync: SyncOptions = DEFAULT
    stats: RowStats | None = None  # row lengths and levels: what the automatic choice looked at
    level_tiling: Tiling | None = None  # the level kernel's tiling
    tuned: dict[str, Any] = field(default_factory=dict)  # candidate -> measured ms ("failed: ..."), when tuned
    _tile_deps: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(repr=False, default_factory=dict)  # R -> CSR
    _mixed_tiles: dict[tuple[int, int], torch.Tensor] = field(repr=False, default_factory=dict)  # (R, threshold) -> tile_ptr
    _done: torch.Tensor = field(repr=False, default=None)  # type: ignore[assignment]
    _ticket: torch.Tensor = field(repr=False, default=None)  # type: ignore[assignment]
    _epoch: int = 0
    _tickets_used: int = 0

    def __post_init__(self) -> None:
        self._done = torch.zeros(max(self.n, 1), dtype=torch.int32, device=self.device)
        self._ticket = torch.zeros(1, dtype=torch.int32, device=self.device)

    @property
    def info(self) -> dict[str, Any]:
        """Plain summary (for reports): sizes, levels, tiling, preprocessing times."""
        return {
            "rows": self.n,
            "nnz": self.nnz,
            "levels": self.num_levels,
            "dtype": str(self.dtype).replace("torch.", ""),
            "mode": self.tiling.mode,
            "rows_per_program": self.tiling.rows_per_program,
            "lanes_per_row": self.tiling.lanes_per_row,
            "num_warps": self.tiling.num_warps,
            "sync": self.sync.name,
            "regime": self.stats.regime if self.stats else None,
            "preprocess_ms": dict(self.preprocess_ms),
        }

    def tiling_for(self, kp: int, tiling: Tiling | None = None) -> Tiling:
        """Tiling for KP padded right-hand sides: fewer rows per program as KP grows."""
        t = tiling or self.tiling
        r = t.rows_per_program
        while r > 1 and r * t.lanes_per_row * kp > 2048:
            r //= 2
        return Tiling(r, t.lanes_per_row, t.num_warps if kp == 1 else min(8, max(t.num_warps, 4)))

    def tile_deps(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Producing tiles of every tile for R = ``r`` (computed once per R, then cached)."""
        if r not in self._tile_deps:
            self._tile_deps[r] = tile_dependencies(self.lo.rowptr, self.lo.cols, self.n, r)
        return self._tile_deps[r]

    def mixed_tiles(self, r: int, long_row_min: int) -> torch.Tensor:
        """Tile boundaries of the mixed tiling (``analysis.mixed_tiles``; computed once per R and threshold)."""
        key = (r, long_row_min)
        if key not in self._mixed_tiles:
            self._mixed_tiles[key] = mixed_tiles(self.lo.rowptr, self.n, r, long_row_min)
        return self._mixed_tiles[key]

    def _next_epoch(self, n_tickets: int) -> tuple[int, int]:
        """Epoch and ticket base of the next launch; ``n_tickets`` = tickets that launch takes."""
        if self._epoch + 1 >= _INT32_MAX or self._tickets_used + n_tickets >= _INT32_MAX:
            self._done.zero_()
            self._ticket.zero_()
            self._epoch, self._tickets_used = 0, 0
        self._epoch += 1
        base = self._tickets_used
        self._tickets_used += n_tickets
        return self._epoch, base

    def capture(self, b: torch.Tensor, sync: SyncOptions | None = None, tiling: Tiling | None = None) -> CapturedSolve:
        """The solve of ``b``'s shape as one CUDA graph: :meth:`CapturedSolve.replay` re-solves
        for whatever ``.b`` holds into ``.x`` with one graph launch (what a caller that solves
        with one matrix many times, or a whole-model graph, runs).

        The graph cannot take the host's epoch and ticket base (they would be frozen at capture),
        so it works on its own done flags and ticket counter and resets them inside the graph
        (two memsets before the kernel); the plan's own workspace is untouched."""
        if self.device.type != "cuda":
            raise RuntimeError("sptrsv: capture needs a CUDA device (a CUDA graph)")
        b2, _, _ = check_rhs(b, self.n, self.dtype, self.device)
        priv = self.graph_twin()
        static_b = b2.clone()
        static_x = torch.empty_like(static_b)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # compiles the kernel outside the capture
            priv.solve(static_b, out=static_x, sync=sync, tiling=tiling)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # on the plan's device's stream: torch.cuda.graph's default capture stream is one per process, made on
        # whichever device was current at the first capture, and capturing on it makes that device current
        with torch.cuda.graph(graph, stream=stream):
            priv.solve(static_b, out=static_x, sync=sync, tiling=tiling)
        return CapturedSolve(graph, static_b, static_x, priv)

    def graph_twin(self) -> SptrsvPlan:
        """A plan sharing this one's matrix and cached tile lists, with its own done flags and
        ticket counter, that resets them before every launch instead of advancing an epoch: each
        solve is the same launch sequence, so a CUDA graph of it can be replayed."""
        twin = replace(self)  # __post_init__ gives it new done flags and a new ticket counter
        twin._next_epoch = twin._graph_epoch  # type: ignore[method-assign]
        return twin

    def _graph_epoch(self, n_tickets: int) -> tuple[int, int]:
        """``_next_epoch`` inside a captured solve: the reset is part of the graph."""
        self._done.zero_()
        self._ticket.zero_()
        return 1, 0

    def solve(self, b: Any, out: torch.Tensor | None = None, sync: SyncOptions | None = None, tiling: Tiling | None = None) -> Any:
        """x with A x = b (sync-free, one launch per group of up to 16 right-hand sides).

        ``sync`` overrides the plan's :class:`SyncOptions` and ``tiling`` the plan's tiling for
        this solve (variant and tiling sweeps; the level order does not depend on the tiling).
        """
        b2, was_1d, was_numpy = check_rhs(b, self.n, self.dtype, self.device)
        x = _prepare_out(out, b2)
        k = b2.shape[1]
        opts = sync or self.sync
        with on_device(self.device):  # Triton launches on the current GPU, not on the tensors' (a plan on cuda:1)
            if self.n > 0:
                fence = hw_fence_enabled(self.device)
                for g0 in range(0, k, MAX_RHS_PER_LAUNCH):
                    kg = min(MAX_RHS_PER_LAUNCH, k - g0)
                    kp = _pow2_ceil(kg)
                    til = self.tiling_for(kp, tiling)
                    r = til.rows_per_program
                    if opts.long_row_min:
                        self._solve_mixed(b2[:, g0:], x[:, g0:], kg, kp, til, opts, fence)
                        continue
                    n_tiles = triton.cdiv(self.n, r)
                    grid = persistent_grid(self.device, n_tiles, opts) if opts.persistent else n_tiles
                    # a persistent program also takes the one ticket past the end that stops it
                    epoch, base = self._next_epoch(n_tiles + grid if opts.persistent else n_tiles)
                    tile = opts.flag_kind == "tile"
                    tdep_ptr, tdeps = self.tile_deps(r) if tile else (self._ticket, self._ticket)
                    lo = self.lo
                    if opts.prefetch:
                        kind = opts.flag_kind
                        sent = SENTINEL[self.dtype]
                        if kind == "value":  # x starts as the sentinel: "not solved yet"
                            xp = torch.full((self.n * kg,), sent, dtype=_INT_OF[self.dtype], device=self.device).view(self.dtype)
                        else:
                            xp = torch.empty(self.n * kg, dtype=self.dtype, device=self.device)
                        _syncfree_fast_kernel[(grid,)](
                            lo.rowptr, lo.cols, lo.vals, lo.diag, lo.perm, lo.levels,
                            b2[:, g0:], x[:, g0:], xp, self._done, self._ticket, tdep_ptr, tdeps,
                            self.n, kg, b2.stride(0), x.stride(0), epoch, base, n_tiles, sent,
                            R=r, W=til.lanes_per_row, KP=kp, HW_FENCE=fence, FLAGS=_FLAG_CODE[kind], DW=DEP_LANES,
                            BACKOFF_NS=opts.backoff_ns, ACQUIRE=opts.acquire, ST_RELEASE=opts.st_release, PERSISTENT=opts.persistent,
                            num_warps=til.num_warps,
                        )  # fmt: skip
                        continue
                    xp = torch.empty(self.n * kg, dtype=self.dtype, device=self.device)
                    _syncfree_kernel[(grid,)](
                        lo.rowptr, lo.cols, lo.vals, lo.diag, lo.perm, lo.levels,
                        b2[:, g0:], x[:, g0:], xp, self._done, self._ticket, tdep_ptr, tdeps,
                        self.n, kg, b2.stride(0), x.stride(0), epoch, base, n_tiles,
                        R=r, W=til.lanes_per_row, KP=kp, HW_FENCE=fence,
                        TILE_FLAGS=tile, DW=DEP_LANES, BACKOFF_NS=opts.backoff_ns, PERSISTENT=opts.persistent,
                        num_warps=til.num_warps,
                    )  # fmt: skip
        return _finish(x, out, was_1d, was_numpy)

    def _solve_mixed(self, b2: torch.Tensor, x: torch.Tensor, kg: int, kp: int, til: Tiling, opts: SyncOptions, fence: bool) -> None:
        """One launch of the mixed-tiling kernel for ``kg`` right-hand sides (padded to ``kp``)."""
        tile_ptr = self.mixed_tiles(til.rows_per_program, opts.long_row_min)
        n_tiles = tile_ptr.numel() - 1
        grid = persistent_grid(self.device, n_tiles, opts) if opts.persistent else n_tiles
        _, base = self._next_epoch(n_tiles + grid if opts.persistent else n_tiles)  # value flags: no epoch
        sent = SENTINEL[self.dtype]
        xp = torch.full((self.n * kg,), sent, dtype=_INT_OF[self.dtype], device=self.device).view(self.dtype)
        wl = max(1, min(opts.long_lanes, MIXED_LONG_ELEMS // kp))  # [WL, KP] long-row gather
        lo = self.lo
        _syncfree_mixed_kernel[(grid,)](
            lo.rowptr, lo.cols, lo.vals, lo.diag, lo.perm, lo.levels, b2, x, xp, self._ticket, tile_ptr,
            kg, b2.stride(0), x.stride(0), base, n_tiles, sent, opts.long_row_min,
            R=til.rows_per_program, W=til.lanes_per_row, WL=wl, KP=kp, HW_FENCE=fence, BACKOFF_NS=opts.backoff_ns,
            PERSISTENT=opts.persistent, num_warps=opts.long_warps,
        )  # fmt: skip


@dataclass
class CapturedSolve:
    """A solve captured as a CUDA graph (:meth:`SptrsvPlan.capture`): write the right-hand side
    into ``b`` (shape (n, k)), ``replay()``, read ``x``. ``plan`` keeps the graph's workspace alive."""

    graph: torch.cuda.CUDAGraph
    b: torch.Tensor
    x: torch.Tensor
    plan: SptrsvPlan

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.x

    def __call__(self, b: torch.Tensor) -> torch.Tensor:
        """Copy ``b`` in, replay, return a copy of x shaped like ``b`` (the next replay overwrites ``x``)."""
        self.b.copy_(b.reshape(self.b.shape))
        return self.replay().clone().reshape(b.shape)


def _prepare_out(out: torch.Tensor | None, b2: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(b2)
    n, k = b2.shape
    shapes = [(n, k), (n,)] if k == 1 else [(n, k)]  # the right-hand side's shape: (n,) or (n, k)
    if out.dtype != b2.dtype or out.device != b2.device or tuple(out.shape) not in shapes or not out.is_contiguous():
        want = " or ".join(str(s) for s in shapes)
        raise ValueError(
            f"sptrsv: out must be a contiguous {b2.dtype} tensor on {b2.device} of shape {want} (the right-hand side's), "
            f"got a {out.dtype} tensor on {out.device} of shape {tuple(out.shape)}{'' if out.is_contiguous() else ', not contiguous'}"
        )
    return out.view(b2.shape)


def _finish(x: torch.Tensor, out: torch.Tensor | None, was_1d: bool, was_numpy: bool) -> Any:
    if out is not None:
        return out
    y = x[:, 0] if was_1d else x
    return y.cpu().numpy() if was_numpy else y


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def analyze(
    a: Any,
    lower: bool = True,
    unit_diagonal: bool = False,
    device: torch.device | str | None = None,
    tiling: Tiling | None = None,
    sync: SyncOptions | None = None,
    tune: bool | None = None,
) -> SptrsvPlan:
    """Check and preprocess a triangular CSR matrix (torch sparse CSR or scipy.sparse).

    Times (wall clock, device synchronised) go to ``plan.preprocess_ms``: ``check`` (validation
    and canonical form), ``levels`` (sync-free level kernel), ``reorder`` (level-order
    renumbering), ``tile_deps`` (producing tiles, only with tile flags) and ``total``.
    ``tiling`` overrides the tiling and ``sync`` the kernel variant
    (``kfuse.sparse.variants``; ``LEGACY`` is the original kernel). Left out, both follow the
    matrix's regime (:class:`~kfuse.sparse.analysis.RowStats`, measured choice in docs/sparse.md):
    short rows -> one-warp 8x4 tiles + value flags; long rows -> the row-length tiling + value
    flags with 2 programs per SM; chains and bands (under 4 rows per level) -> the row-length
    tiling + ``LEGACY``. The level kernel uses ``tiling`` or the row-length tiling.

    ``tune`` (default: on a CUDA device when neither ``tiling`` nor ``sync`` is given) times that
    choice against the regime's alternatives on this GPU and keeps the fastest correct one
    (:mod:`kfuse.sparse.tune`); the times are in ``plan.tuned`` and the cost in
    ``preprocess_ms["tune"]``. Tuning raises RuntimeError when no candidate solves the system
    correctly on this device.
    """
    if device is None and not isinstance(a, torch.Tensor):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # decided here: ``sync`` is filled in with the heuristic's choice below
    tune_on_gpu = tune is None and tiling is None and sync is None
    t0 = time.perf_counter()
    tri = canonicalize(a, lower=lower, unit_diagonal=unit_diagonal, device=device)
    if tri.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"sptrsv: the solver's kernels run on a CUDA device, or on the CPU in the Triton interpreter; got a {tri.device} "
            "matrix without it (set TRITON_INTERPRET=1 before triton is first imported, or pass device='cuda')"
        )
    if tri.cols.numel() >= _INT32_MAX or tri.n >= _INT32_MAX // MAX_RHS_PER_LAUNCH:
        raise ValueError(f"sptrsv: matrix too large for 32-bit indexing (n={tri.n}, nnz={tri.nnz})")
    stats = row_stats(tri.rowptr[1:] - tri.rowptr[:-1])
    lev_til = tiling or row_length_tiling(stats)
    _sync(tri.device)
    t1 = time.perf_counter()
    lev = compute_levels(tri, lev_til)
    _sync(tri.device)
    t2 = time.perf_counter()
    lo = level_order(tri, lev)
    _sync(tri.device)
    t3 = time.perf_counter()
    ms = {"check": (t1 - t0) * 1e3, "levels": (t2 - t1) * 1e3, "reorder": (t3 - t2) * 1e3}
    stats = replace(stats, levels=len(lo.level_ptr) - 1)
    til = tiling or choose_tiling(stats)
    sync = sync or choose_sync(stats)
    plan = SptrsvPlan(
        n=tri.n,
        nnz=tri.nnz,
        dtype=tri.dtype,
        device=tri.device,
        lower=lower,
        unit_diagonal=unit_diagonal,
        num_levels=len(lo.level_ptr) - 1,
        tiling=til,
        lo=lo,
        preprocess_ms=ms,
        sync=sync,
        stats=stats,
        level_tiling=lev_til,
    )
    if sync.flag_kind == "tile" and plan.n > 0:  # the one-RHS tiling's lists; other R are built on first use
        plan.tile_deps(til.rows_per_program)
        _sync(tri.device)
    t4 = time.perf_counter()
    ms["tile_deps"] = (t4 - t3) * 1e3
    if (tune or (tune_on_gpu and plan.device.type == "cuda")) and plan.n > 0:
        from kfuse.sparse.tune import tune as _tune

        plan.tuned = _tune(plan)
        _sync(tri.device)
    t5 = time.perf_counter()
    ms["tune"] = (t5 - t4) * 1e3
    ms["total"] = (t5 - t0) * 1e3
    return plan


def sptrsv(
    a: Any,
    b: Any,
    lower: bool | None = None,
    unit_diagonal: bool | None = None,
    method: str = "syncfree",
) -> Any:
    """Solve ``A x = b`` for triangular CSR ``A`` (or an :class:`SptrsvPlan`).

    ``lower`` (default True) and ``unit_diagonal`` (default False) describe ``A``; with a plan they
    default to the plan's, and a value contradicting the plan raises ValueError (the plan's system
    is fixed by :func:`analyze`).

    ``b`` has shape (n,) or (n, k) (torch tensor or numpy array; the result has the same kind
    and shape). ``method`` is ``"syncfree"`` (one kernel) or ``"levelset"`` (one launch per
    level, the baseline). For repeated solves with one matrix, call :func:`analyze` once and
    pass the plan (or call ``plan.solve``): a one-off call does not tune (timing the candidates
    costs more than one solve can win back), ``analyze`` on a GPU does.
    """
    if method not in ("syncfree", "levelset"):
        raise ValueError(f"sptrsv: unknown method {method!r}; use 'syncfree' or 'levelset'")
    if isinstance(a, SptrsvPlan):
        plan = a
        for name, given, planned in (("lower", lower, plan.lower), ("unit_diagonal", unit_diagonal, plan.unit_diagonal)):
            if given is not None and bool(given) != planned:
                raise ValueError(
                    f"sptrsv: {name}={given} contradicts the plan, analysed with {name}={planned}; "
                    f"analyze() the matrix with {name}={given} or leave {name} out"
                )
    else:
        dev = b.device if isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor) else None
        lower = True if lower is None else lower
        unit_diagonal = False if unit_diagonal is None else unit_diagonal
        plan = analyze(a, lower=lower, unit_diagonal=unit_diagonal, device=dev, tune=False)
    if method == "levelset":
        from kfuse.sparse.levelset import levelset_solve

        return levelset_solve(plan, b)
    return plan.solve(b)


__all__ = ["SptrsvPlan", "SyncOptions", "analyze", "sptrsv"]
