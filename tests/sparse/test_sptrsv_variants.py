"""Every synchronisation variant of the sync-free solve against scipy (Triton interpreter on the CPU,
the compiled kernels on a GPU).

The interpreter runs programs in id order and never spins, so it checks the arithmetic, the
tile-dependency lists (a missing or later producer would give wrong x or spin forever), the
persistent loop's termination and the ticket/epoch accounting across solves. The backoff is
compiled out there (it is inline asm); test_sptrsv_ptx.py checks it in the sm_90 PTX. On a GPU the
same tests run the real spin-waits. Plans analysed without ``sync``/``tiling`` pass ``tune=False``:
``analyze`` tunes by default on a GPU, and the tests solve with the heuristic's tiling on both.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

from kfuse.sparse import SptrsvPlan, SyncOptions, analyze
from kfuse.sparse.analysis import Tiling
from kfuse.sparse.matrices import make
from kfuse.sparse.tiledeps import tile_dependencies
from kfuse.sparse.variants import DEFAULT, DEFAULT_LONG_ROWS, EXPERIMENT_DEFAULT, LEGACY, VARIANTS, persistent_grid

# the variants that differ in the interpreter (backoff/programs-per-SM only change timing there)
DISTINCT = ["legacy", "tileflags", "persistent", "default-v1", "prefetch", "prefetch+acquire+strel", "rowflags+prefetch+acquire", "default"]
FAST = ["prefetch", "prefetch+acquire", "prefetch+acquire+strel", "rowflags+prefetch+acquire", "default", "default-grid"]
SINGLE_WARP = [Tiling(16, 2, 1), Tiling(8, 4, 1), Tiling(32, 1, 1)]
CASES = [("banded", 61), ("powerlaw", 151), ("laplacian2d", 7), ("laplacian3d", 4), ("chain", 83)]
TOL = {np.float64: 1e-11, np.float32: 2e-4}


def _check(plan: SptrsvPlan, a: sp.csr_matrix, lower: bool, dtype: type, nrhs: int | None, sync: SyncOptions) -> None:
    n = a.shape[0]
    shape = (n,) if nrhs is None else (n, nrhs)
    b = np.random.default_rng().standard_normal(shape).astype(dtype)
    out = torch.full(shape, float("nan"), dtype=torch.from_numpy(b).dtype, device=plan.device)  # poisoned output
    x = plan.solve(torch.from_numpy(b).to(plan.device), out=out, sync=sync).cpu().numpy()
    ref = sla.spsolve_triangular(a.astype(np.float64), b.astype(np.float64), lower=lower)
    err = float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))
    assert np.isfinite(x).all() and err < TOL[dtype], (sync.name, lower, dtype, nrhs, err)


@pytest.mark.parametrize("variant", DISTINCT)
@pytest.mark.parametrize("kind,size", CASES)
def test_variant_matches_scipy(kind: str, size: int, variant: str, device: str) -> None:
    sync = VARIANTS[variant]
    a64 = make(kind, size, seed=int(np.random.default_rng().integers(1 << 30)))
    for lower in (True, False):
        a = a64 if lower else a64.T.tocsr()
        for dtype, nrhs in ((np.float64, None), (np.float32, 3)):
            plan = analyze(a.astype(dtype), lower=lower, device=device, sync=sync)
            _check(plan, a.astype(dtype), lower, dtype, nrhs, sync)


@pytest.mark.parametrize("variant", DISTINCT)
def test_variant_many_rhs_and_tilings(variant: str, device: str) -> None:
    sync = VARIANTS[variant]
    a = make("laplacian2d", 6, seed=2)
    _check(analyze(a, device=device, tune=False), a, True, np.float64, 18, sync)  # two launches, R shrinks with K
    p = make("powerlaw", 64, seed=5)
    for til in (Tiling(1, 256, 4), Tiling(4, 2, 1)):  # block-per-row (tile = row), chunked rows
        _check(analyze(p, device=device, tiling=til), p, True, np.float64, None, sync)


@pytest.mark.parametrize("variant", FAST)
def test_single_warp_tilings(variant: str, device: str) -> None:
    """R x W = 32 lanes, one warp: the tilings the experiment sweeps (plus W=1, rows of 3 chunks)."""
    sync = VARIANTS[variant]
    for kind, size in (("laplacian3d", 4), ("powerlaw", 90)):
        a = make(kind, size, seed=7)
        for lower in (True, False):
            al = a if lower else a.T.tocsr()
            plan = analyze(al, lower=lower, device=device, sync=sync)
            for til in SINGLE_WARP:
                n = al.shape[0]
                b = np.random.default_rng(3).standard_normal(n)
                out = torch.full((n,), float("nan"), dtype=torch.float64, device=device)
                x = plan.solve(torch.from_numpy(b).to(device), out=out, sync=sync, tiling=til).cpu().numpy()
                ref = sla.spsolve_triangular(al, b, lower=lower)
                assert np.abs(x - ref).max() / np.abs(ref).max() < 1e-11, (variant, kind, lower, til)


def test_value_flag_sentinel_is_a_signalling_nan() -> None:
    """The sentinel must be a NaN that arithmetic never produces (quiet bit clear, payload set)."""
    from kfuse.sparse.sptrsv import SENTINEL

    assert np.isnan(np.array([SENTINEL[torch.float64]], dtype=np.int64).view(np.float64)[0])
    assert np.isnan(np.array([SENTINEL[torch.float32]], dtype=np.int32).view(np.float32)[0])
    assert not SENTINEL[torch.float64] >> 51 & 1 and not SENTINEL[torch.float32] >> 22 & 1  # quiet bit clear
    q = np.array([np.nan, np.inf - np.inf, np.float64(0.0) / np.float64(0.0)])
    assert SENTINEL[torch.float64] not in q.view(np.int64).tolist()


def test_all_named_variants_once(device: str) -> None:
    a = make("laplacian3d", 4, seed=3)
    plan = analyze(a, device=device, tune=False)
    for sync in VARIANTS.values():
        _check(plan, a, True, np.float64, None, sync)


def test_tile_dependencies_match_brute_force(device: str) -> None:
    a = make("powerlaw", 120, seed=11)
    plan = analyze(a, device=device, tune=False)
    lo = plan.lo
    rowptr, all_cols = lo.rowptr.cpu(), lo.cols.cpu()  # the brute force on the host
    for r in (1, 4, 8, 32):
        ptr, deps = (v.cpu() for v in tile_dependencies(lo.rowptr, lo.cols, plan.n, r))  # built on the plan's device
        for t in range(-(-plan.n // r)):
            lo_p, hi_p = t * r, min(plan.n, (t + 1) * r)
            cols = all_cols[rowptr[lo_p] : rowptr[hi_p]].tolist()
            want = sorted({c // r for c in cols if c < lo_p})
            assert deps[ptr[t] : ptr[t + 1]].tolist() == want, (r, t)


def test_mixed_variants_on_one_plan_and_counter_reset(device: str) -> None:
    a = make("chain", 90, seed=6)
    plan = analyze(a, device=device, sync=LEGACY)
    order = ["persistent", "legacy", "default", "tileflags", "prefetch+acquire", "default-v1", "rowflags+prefetch+acquire", "default"]
    for name in order:  # tickets of a persistent launch include one stop ticket per program
        _check(plan, a, True, np.float64, None, VARIANTS[name])
    plan._tickets_used = 2**31 - 5  # the next launch would overflow the ticket counter: reset
    for name in order[:3]:
        _check(plan, a, True, np.float64, 2, VARIANTS[name])
    assert plan._tickets_used < 1000


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["tileflags", "default-v1", "prefetch+acquire", "rowflags+prefetch+acquire", "default"])
def test_long_chain_no_deadlock(variant: str, device: str) -> None:
    a = make("chain", 700, seed=4)
    plan = analyze(a, device=device, sync=VARIANTS[variant])
    assert plan.num_levels == 700
    _check(plan, a, True, np.float64, None, plan.sync)


def test_sync_options(device: str) -> None:
    assert SyncOptions().tile_flags and SyncOptions().persistent and SyncOptions().backoff_ns > 0
    assert LEGACY.name == "grid-rowflag" and VARIANTS["default-v1"].name == "persistent-tileflag-sleep64-ppsm8"
    assert VARIANTS["default"] is DEFAULT and DEFAULT.name == "persistent-valueflag-prefetch-ppsm8"
    assert VARIANTS["prefetch+acquire+strel"].name == "persistent-tileflag-prefetch-acq-strel-ppsm8"
    assert set(EXPERIMENT_DEFAULT) <= set(VARIANTS) and {"legacy", "default-v1", "default"} <= set(EXPERIMENT_DEFAULT)
    for bad in (
        dict(acquire=True),
        dict(flags="value"),
        dict(prefetch=True, flags="x"),
        dict(prefetch=True, tile_flags=False, flags="tile"),
    ):
        with pytest.raises(ValueError, match="SyncOptions"):
            SyncOptions(**bad)
    assert persistent_grid(torch.device(device), 5, SyncOptions(programs_per_sm=32)) == 5  # never more programs than tiles
    with pytest.raises(ValueError, match="backoff_ns"):
        SyncOptions(backoff_ns=-1)
    with pytest.raises(ValueError, match="programs_per_sm"):
        SyncOptions(programs_per_sm=0)
    assert VARIANTS["default-ppsm2"] is DEFAULT_LONG_ROWS and DEFAULT_LONG_ROWS.name == "persistent-valueflag-prefetch-ppsm2"
    # the heuristic's choice (a GPU would otherwise tune it: test_sptrsv_tune.py)
    assert analyze(make("chain", 10), device=device, tune=False).info["sync"] == LEGACY.name  # chains keep the measured kernel
    assert analyze(make("laplacian2d", 9), device=device, tune=False).info["sync"] == DEFAULT.name
