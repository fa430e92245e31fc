"""Mixed tiling (``SyncOptions.long_row_min``): long rows get their own wide program (Triton interpreter
on the CPU, compiled on a GPU).

Checks the tile list (long rows alone, short runs cut at R, contiguous and increasing, so the
ticket order stays a level order), and the solve against scipy with poisoned outputs: lower
and upper, fp64 with 1 RHS and fp32 with 3 RHS, on matrices with a few very long rows next to
short ones, on every generated kind (where no row may be long), a dense triangle (every long
row depends on the previous long row) and a long chain (no deadlock). The sm_90 compile check
is ``test_mixed_kernel_ptx_for_sm90`` in test_sptrsv_ptx.py. Plans analysed without ``sync`` pass
``tune=False`` (``analyze`` tunes by default on a GPU): the heuristic's tiling runs on both devices.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

from kfuse.sparse import SptrsvPlan, SyncOptions, analyze
from kfuse.sparse.analysis import Tiling, mixed_tiles, tile_kinds
from kfuse.sparse.matrices import make
from kfuse.sparse.variants import DEFAULT_LONG_ROWS, MIXED, MIXED_EXPERIMENT, VARIANTS, persistent_grid

MIXED_GRID = replace(MIXED, persistent=False)
SMALL_LONG = replace(MIXED, long_lanes=32, long_warps=1)  # several chunks per long row in a one-warp program
OPTIONS = {"mixed": MIXED, "mixed-t32": VARIANTS["mixed-t32"], "mixed-grid": MIXED_GRID, "small-long": SMALL_LONG}
TOL = {np.float64: 1e-11, np.float32: 2e-4}


def _upper(a: sp.csr_matrix) -> sp.csr_matrix:
    """Reversed index order: an upper triangle with the same row lengths (long rows stay long)."""
    return a[::-1, ::-1].tocsr()


def _check(
    plan: SptrsvPlan, a: sp.csr_matrix, lower: bool, dtype: type, nrhs: int | None, sync: SyncOptions, tiling: Tiling | None = None
) -> None:
    n = a.shape[0]
    shape = (n,) if nrhs is None else (n, nrhs)
    b = np.random.default_rng().standard_normal(shape).astype(dtype)
    out = torch.full(shape, float("nan"), dtype=torch.from_numpy(b).dtype, device=plan.device)  # poisoned output
    x = plan.solve(torch.from_numpy(b).to(plan.device), out=out, sync=sync, tiling=tiling).cpu().numpy()
    ref = sla.spsolve_triangular(a.astype(np.float64), b.astype(np.float64), lower=lower)
    err = float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))
    assert np.isfinite(x).all() and err < TOL[dtype], (sync.name, lower, dtype, nrhs, err)


def _brute_tiles(lens: np.ndarray, r: int, thr: int) -> list[int]:
    ptr, run = [], 0
    for p, ln in enumerate(lens):
        if ln > thr:
            ptr.append(p)
            run = 0
        else:
            if run % r == 0:
                ptr.append(p)
            run += 1
    return ptr + [len(lens)]


@pytest.mark.parametrize("r,thr", [(8, 64), (4, 3), (1, 0), (32, 10)])
def test_mixed_tiles_match_brute_force(r: int, thr: int, device: str) -> None:
    a = make("heavyrows", 200, seed=3)
    plan = analyze(a, device=device, tune=False)
    lens = (plan.lo.rowptr[1:] - plan.lo.rowptr[:-1]).cpu().numpy()
    ptr = mixed_tiles(plan.lo.rowptr, plan.n, r, thr)  # on the plan's device
    assert ptr.dtype == torch.int32 and ptr.tolist() == _brute_tiles(lens, r, thr)
    kinds = tile_kinds(ptr, plan.lo.rowptr, thr).cpu().numpy()
    sizes = np.diff(ptr.cpu().numpy())
    assert (sizes >= 1).all() and (sizes <= r).all()
    assert int(kinds.sum()) == int((lens > thr).sum())  # every long row is a tile of its own
    assert (sizes[kinds == 1] == 1).all()
    assert mixed_tiles(torch.zeros(1, dtype=torch.int32, device=device), 0, 8, 64).tolist() == [0]


def test_heavy_matrix_has_long_and_short_rows() -> None:
    a = make("heavyrows", 300, seed=1)
    lens = np.diff(a.indptr) - 1
    assert (lens > 64).sum() >= 4 and np.median(lens) < 8 and lens.max() > 200


@pytest.mark.parametrize("name,size,seed", [(nm, 120, 2) for nm in OPTIONS] + [("mixed", 300, 1)])
def test_mixed_matches_scipy_on_heavy_rows(name: str, size: int, seed: int, device: str) -> None:
    sync = OPTIONS[name]
    a64 = make("heavyrows", size, seed=seed)
    for lower in (True, False):
        a = a64 if lower else _upper(a64)
        for dtype, nrhs in ((np.float64, None), (np.float32, 3)):
            plan = analyze(a.astype(dtype), lower=lower, device=device, sync=sync)
            assert plan.sync == sync
            tiles = plan.mixed_tiles(plan.tiling_for(1).rows_per_program, sync.long_row_min)
            assert int(tile_kinds(tiles, plan.lo.rowptr, sync.long_row_min).sum()) >= 4  # the long path runs
            _check(plan, a.astype(dtype), lower, dtype, nrhs, sync)


@pytest.mark.parametrize("kind,size", [("banded", 61), ("powerlaw", 151), ("laplacian2d", 7), ("laplacian3d", 4), ("chain", 83)])
def test_mixed_on_every_kind(kind: str, size: int, device: str) -> None:
    """Without long rows the mixed kernel only runs packed tiles (a threshold of 2 makes some long)."""
    a64 = make(kind, size, seed=int(np.random.default_rng().integers(1 << 30)))
    for lower in (True, False):
        a = a64 if lower else a64.T.tocsr()
        plan = analyze(a, lower=lower, device=device, tune=False)
        for sync in (MIXED, replace(MIXED, long_row_min=2)):
            _check(plan, a, lower, np.float64, None, sync)
        p32 = analyze(a.astype(np.float32), lower=lower, device=device, tune=False)
        _check(p32, a.astype(np.float32), lower, np.float32, 3, MIXED)


def test_dense_triangle_long_rows_depend_on_each_other(device: str) -> None:
    """Every row past 64 is long and depends on every earlier one: consecutive long tiles, one per level."""
    n = 80
    rng = np.random.default_rng(4)
    off = np.tril(rng.uniform(-1, 1, (n, n)), -1) / n
    a = sp.csr_matrix(off + np.diag(rng.uniform(1.0, 2.0, n)))
    plan = analyze(a, device=device, tune=False)
    kinds = tile_kinds(plan.mixed_tiles(plan.tiling.rows_per_program, 64), plan.lo.rowptr, 64)
    assert int(kinds.sum()) == n - 65
    for sync in (MIXED, SMALL_LONG, MIXED_GRID):
        _check(plan, a, True, np.float64, None, sync)
    _check(plan, a, True, np.float64, 18, MIXED)  # two launches; long-row lanes shrink with K


def test_mixed_many_rhs_and_tilings(device: str) -> None:
    a = make("heavyrows", 150, seed=6)
    plan = analyze(a, device=device, tune=False)
    _check(plan, a, True, np.float64, 18, MIXED)  # 16 + 2 columns: KP 16 (WL 128) then 2
    for til in (Tiling(1, 256, 4), Tiling(4, 2, 1), Tiling(16, 2, 1), Tiling(8, 4, 1)):
        _check(plan, a, True, np.float64, None, MIXED, tiling=til)


def test_mixed_long_chain_no_deadlock(device: str) -> None:
    """700 rows, one per level (two sub-diagonals): packed tiles (MIXED), then every row a long tile (threshold 1)."""
    n = 700
    rng = np.random.default_rng(8)
    a = sp.diags([rng.uniform(2, 3, n), rng.uniform(-0.5, 0.5, n - 1), rng.uniform(-0.5, 0.5, n - 2)], [0, -1, -2], format="csr")
    for sync in (MIXED, replace(MIXED, long_row_min=1, long_lanes=2, long_warps=1)):
        plan = analyze(a, device=device, sync=sync)
        _check(plan, a, True, np.float64, None, sync)


def test_mixed_mixes_with_other_variants_on_one_plan(device: str) -> None:
    """Ticket accounting: the mixed launch takes #tiles (+ grid) tickets like the others."""
    a = make("heavyrows", 200, seed=9)
    plan = analyze(a, device=device, tune=False)
    for sync in (MIXED, DEFAULT_LONG_ROWS, VARIANTS["legacy"], MIXED_GRID, VARIANTS["default-v1"], MIXED):
        _check(plan, a, True, np.float64, None, sync)
    t = plan.mixed_tiles(plan.tiling.rows_per_program, 64).numel() - 1
    used = plan._tickets_used
    _check(plan, a, True, np.float64, None, MIXED)
    assert plan._tickets_used - used == t + persistent_grid(plan.device, t, MIXED)
    plan._epoch, plan._tickets_used = 2**31 - 3, 2**31 - 3  # forces the counter reset before the next launch
    _check(plan, a, True, np.float64, None, MIXED)
    assert plan._tickets_used < 1000


def test_mixed_options_and_names() -> None:
    assert MIXED.long_row_min == 64 and MIXED.long_lanes == 256 and MIXED.flag_kind == "value"
    assert MIXED.programs_per_sm == DEFAULT_LONG_ROWS.programs_per_sm
    assert "mixed64x256w4" in MIXED.name and "mixed" not in DEFAULT_LONG_ROWS.name
    assert set(MIXED_EXPERIMENT) <= set(VARIANTS)
    with pytest.raises(ValueError, match="needs prefetch"):
        SyncOptions(long_row_min=64)
    with pytest.raises(ValueError, match="needs prefetch"):
        SyncOptions(backoff_ns=0, prefetch=True, long_row_min=64)  # tile flags
    with pytest.raises(ValueError, match="power of two"):
        replace(MIXED, long_lanes=200)
    with pytest.raises(ValueError, match=">= 0"):
        replace(MIXED, long_row_min=-1)


def test_automatic_choice_unchanged(device: str) -> None:
    """Mixed tiling is not in the heuristic: its power-law choice stays DEFAULT_LONG_ROWS. (Tuning, on by
    default on a GPU, may still keep a mixed candidate by measurement: kfuse.sparse.tune, so it is off here.)"""
    plan = analyze(make("heavyrows", 300, seed=1), device=device, tune=False)
    assert plan.sync == DEFAULT_LONG_ROWS and not plan.sync.long_row_min
