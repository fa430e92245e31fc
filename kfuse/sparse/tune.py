"""Measured choice of the solve's kernel variant and tiling, on the GPU it will run on.

The regime heuristic (:func:`~kfuse.sparse.analysis.choose_sync` and ``choose_tiling``) is the
first candidate; each regime adds the alternatives that won somewhere in the variants runs
(docs/sparse.md): other tilings for short rows, mixed tiling for power-law rows. Each candidate
solves one random right-hand side: a warm-up (compiles the kernel), then the median of a few
CUDA-event timed solves. A candidate whose solution fails the backward-error check is recorded as
failed and never chosen; one far slower than the best so far stops after one timed solve. A single
candidate is checked but not timed; when no candidate is correct, tuning raises RuntimeError.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from kfuse.bench.harness import time_ms
from kfuse.sparse.analysis import RowStats, Tiling, choose_sync, choose_tiling, row_length_tiling
from kfuse.sparse.variants import DEFAULT, MIXED, SyncOptions

if TYPE_CHECKING:
    from kfuse.sparse.sptrsv import SptrsvPlan

Candidate = tuple[SyncOptions, Tiling]
ONE_WARP_8X4 = Tiling(8, 4, 1)
TOL = {torch.float64: 1e-10, torch.float32: 1e-4}  # backward error a correct solve stays under (rounding, long rows)
REPS = 3
CUTOFF = 3.0  # a candidate this many times slower than the best after one solve is not repeated


def candidates(stats: RowStats) -> list[Candidate]:
    """The heuristic's (variant, tiling) first, then the regime's alternatives (no duplicates)."""
    first = (choose_sync(stats), choose_tiling(stats))
    rl = row_length_tiling(stats)
    if stats.regime == "short":
        alts = [(DEFAULT, rl), (replace(DEFAULT, persistent=False), ONE_WARP_8X4)]
    elif stats.regime == "long":
        alts = [(MIXED, rl), (MIXED, ONE_WARP_8X4), (replace(MIXED, long_row_min=32), rl)]
    else:  # chains and bands: the original kernel is the only one measured there
        alts = []
    out: list[Candidate] = []
    for c in [first, *alts]:
        if c not in out:
            out.append(c)
    return out


def label(c: Candidate) -> str:
    s, t = c
    return f"{s.name}@{t.rows_per_program}x{t.lanes_per_row}w{t.num_warps}"


def _event_ms(fn: Callable[[], object], device: torch.device | None = None) -> float:
    """One solve's time: CUDA events on a GPU device, wall clock otherwise (the harness's timer, no warm-up)."""
    return time_ms(fn, warmup=0, rep=1, device=device)


Timer = Callable[[Callable[[], object]], float]


def backward_error(plan: SptrsvPlan, b: torch.Tensor, x: torch.Tensor) -> float:
    """max |A x - b| / max (|b| + |A| |x|) over the rows (the normwise backward error), computed from
    the plan's level-ordered matrix by a scatter-add, independently of any solve kernel. NaN in ``x``
    gives NaN. A correct triangular solve is at the dtype's rounding level; a wrong one is not."""
    lo = plan.lo
    xp, bp = x.reshape(-1)[lo.perm.long()], b.reshape(-1)[lo.perm.long()]  # position order
    rows = torch.repeat_interleave(torch.arange(plan.n, device=x.device), (lo.rowptr[1:] - lo.rowptr[:-1]).long())
    terms = lo.vals * xp[lo.cols.long()]
    ax = (lo.diag * xp).index_add(0, rows, terms)
    scale = (bp.abs() + (lo.diag * xp).abs()).index_add(0, rows, terms.abs())
    return float((ax - bp).abs().max() / scale.max().clamp_min(torch.finfo(x.dtype).tiny)) if plan.n else 0.0


def _solves_correctly(plan: SptrsvPlan, b: torch.Tensor, x: torch.Tensor, c: Candidate, results: dict[str, float | str]) -> bool:
    """One solve of ``b`` with candidate ``c`` into ``x`` (compiles it), checked against the system by
    its backward error; a failure is recorded in ``results``."""
    sync, til = c
    x.fill_(float("nan"))
    try:
        plan.solve(b, out=x, sync=sync, tiling=til)  # warm-up: compiles this variant
    except Exception as e:  # a variant that cannot compile here is skipped, never chosen
        results[label(c)] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        return False
    # each candidate against the system itself: the first one is a kernel under test too
    err = backward_error(plan, b, x)
    if not err <= TOL.get(plan.dtype, 1e-6):  # NaN fails too
        results[label(c)] = f"failed: backward error {err:.1e} (a wrong solution)"
        return False
    return True


def tune(plan: SptrsvPlan, cands: list[Candidate] | None = None, timer: Timer | None = None) -> dict[str, float | str]:
    """Time ``cands`` (default: :func:`candidates` of the plan's stats) on the plan's device and
    set ``plan.sync`` / ``plan.tiling`` to the fastest correct one. Returns label -> median ms
    (or ``"failed: ..."``); the plan's own workspace is used, so the plan stays consistent.

    A single candidate (chains and bands) is not timed, but still solved once and checked (its
    entry then reads ``"correct, not timed (the only candidate)"``). Raises RuntimeError when no
    candidate solves the system correctly on this device: the plan would compute wrong answers."""
    if cands is None:
        if plan.stats is None:
            raise ValueError("sptrsv tune: the plan has no row statistics")
        cands = candidates(plan.stats)
        current = (plan.sync, plan.tiling)  # an explicit choice given to analyze() is measured first
        cands = [current] + [c for c in cands if c != current]
    if not cands:
        raise ValueError("sptrsv tune: no candidates")
    if timer is None:  # the plan's device, not the machine's: a CPU plan (the interpreter) on a GPU machine has no events to time
        timer = functools.partial(_event_ms, device=plan.device)
    b = torch.randn(plan.n, 1, dtype=plan.dtype, device=plan.device)
    x = torch.empty_like(b)
    results: dict[str, float | str] = {}
    best: tuple[float, Candidate] | None = None
    for c in cands:
        if not _solves_correctly(plan, b, x, c, results):
            continue
        if len(cands) == 1:  # nothing to compare: checked, no time spent
            results[label(c)] = "correct, not timed (the only candidate)"
            best = (0.0, c)
            break
        sync, til = c
        times = [timer(lambda s=sync, t=til: plan.solve(b, out=x, sync=s, tiling=t))]
        if best is None or times[0] < CUTOFF * best[0]:
            times += [timer(lambda s=sync, t=til: plan.solve(b, out=x, sync=s, tiling=t)) for _ in range(REPS - 1)]
        ms = statistics.median(times)
        results[label(c)] = round(ms, 4)
        if best is None or ms < best[0]:
            best = (ms, c)
    if best is None:
        detail = "; ".join(f"{k}: {v}" for k, v in results.items())
        raise RuntimeError(f"sptrsv tune: no kernel variant solves this system correctly on {plan.device} ({detail})")
    plan.sync, plan.tiling = best[1]
    return results
