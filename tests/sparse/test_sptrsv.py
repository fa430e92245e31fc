"""Sync-free and level-set triangular solves against scipy (Triton interpreter on the CPU, compiled on a GPU).

``analyze`` tunes by default on a GPU (times the regime's candidates and keeps the fastest): the tests
that solve with the plan's own choice pass ``tune=False``, so that the heuristic's kernel and tiling
run on both devices (tuning itself: test_sptrsv_tune.py and ``test_gpu_analyze_tunes_by_default``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

from kfuse.sparse import analyze, sptrsv
from kfuse.sparse.analysis import Tiling, choose_sync, choose_tiling, row_length_tiling, row_stats
from kfuse.sparse.levelset import levelset_solve
from kfuse.sparse.matrices import make
from kfuse.sparse.variants import DEFAULT, DEFAULT_LONG_ROWS, LEGACY, VARIANTS

# small shapes: odd sizes, each kind keeps its character (chain: every row depends on the previous)
CASES = [("banded", 97), ("powerlaw", 211), ("laplacian2d", 9), ("laplacian3d", 5), ("chain", 131)]
TOL = {np.float64: 1e-11, np.float32: 2e-4}


def _rng() -> np.random.Generator:
    return np.random.default_rng()  # fresh inputs every run


def _rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))


def _levels(a: sp.csr_matrix, lower: bool) -> int:
    """Number of dependency levels by a plain sequential sweep."""
    n = a.shape[0]
    lev = np.zeros(n, dtype=np.int64)
    order = range(n) if lower else range(n - 1, -1, -1)
    for i in order:
        c = a.indices[a.indptr[i] : a.indptr[i + 1]]
        c = c[(c < i) if lower else (c > i)]
        lev[i] = 1 + (lev[c].max() if c.size else 0)
    return int(lev.max()) if n else 0


def _solve_and_check(a: sp.csr_matrix, lower: bool, dtype: type, nrhs: int | None, device: str, method: str = "syncfree", **kw) -> None:
    a = a.astype(dtype)
    n = a.shape[0]
    shape = (n,) if nrhs is None else (n, nrhs)
    b = _rng().standard_normal(shape).astype(dtype)
    plan = analyze(a, lower=lower, device=device, tune=False, **kw)
    out = torch.full(shape, float("nan"), dtype=torch.from_numpy(b).dtype, device=device)  # poisoned output
    solve = plan.solve if method == "syncfree" else lambda bb, out: levelset_solve(plan, bb, out=out)
    x = solve(torch.from_numpy(b).to(device), out=out).cpu().numpy()
    ref = sla.spsolve_triangular(a.astype(np.float64), b.astype(np.float64), lower=lower)
    assert np.isfinite(x).all()
    assert _rel_err(x, ref) < TOL[dtype], (method, lower, dtype, _rel_err(x, ref))


@pytest.mark.parametrize("kind,size", CASES)
@pytest.mark.parametrize("lower", [True, False])
def test_syncfree_matches_scipy(kind: str, size: int, lower: bool, device: str) -> None:
    a = make(kind, size, seed=int(_rng().integers(1 << 30)))
    if not lower:
        a = a.T.tocsr()
    _solve_and_check(a, lower, np.float64, None, device)
    plan = analyze(a, lower=lower, device=device, tune=False)
    assert plan.num_levels == _levels(a, lower)


@pytest.mark.parametrize("kind,size", [("powerlaw", 150), ("laplacian2d", 8)])
def test_fp32_and_levelset(kind: str, size: int, device: str) -> None:
    a = make(kind, size, seed=3)
    _solve_and_check(a, True, np.float32, None, device)
    _solve_and_check(a, True, np.float64, None, device, method="levelset")
    _solve_and_check(a.T.tocsr(), False, np.float32, 2, device, method="levelset")


@pytest.mark.parametrize("nrhs", [1, 3, 18])
def test_multiple_rhs(nrhs: int, device: str) -> None:
    _solve_and_check(make("laplacian2d", 7, seed=1), True, np.float64, nrhs, device)


@pytest.mark.parametrize(
    "tiling",
    [Tiling(1, 256, 4), Tiling(1, 2, 1), Tiling(4, 2, 1), Tiling(32, 4, 2)],
    ids=["block-per-row", "row-narrow", "chunks", "wide-tile"],
)
def test_tilings(tiling: Tiling, device: str) -> None:
    a = make("powerlaw", 64, seed=5)
    _solve_and_check(a, True, np.float64, None, device, tiling=tiling)
    _solve_and_check(make("chain", 37, seed=2), True, np.float32, 2, device, tiling=tiling)


def test_heuristic_picks_rows_vs_blocks() -> None:
    short = row_length_tiling(torch.full((1000,), 3))
    long = choose_tiling(torch.full((1000,), 500))
    assert short.mode == "warp-per-row" and short.rows_per_program > 1 and short.lanes_per_row == 4
    assert long.mode == "block-per-row" and long.rows_per_program == 1
    assert choose_tiling(torch.full((1000,), 3)) == Tiling(8, 4, 1)  # short rows, no level count: wide
    assert choose_tiling(torch.full((1000,), 3), num_levels=1000) == short  # a chain-like level count: narrow
    assert choose_tiling(torch.zeros(0, dtype=torch.int64)) == Tiling(1, 2, 1)


# the bench matrices (benchmarks/sptrsv_bench.py --sizes small, plus the level counts of the
# larger ones from the H200 records) -> (tiling, kernel) the automatic choice must give
BENCH_CHOICES = [
    ("laplacian3d", 40, None, Tiling(8, 4, 1), DEFAULT),
    ("laplacian2d", 256, None, Tiling(8, 4, 1), DEFAULT),
    ("powerlaw", 100_000, None, Tiling(8, 16, 2), DEFAULT_LONG_ROWS),
    ("banded", 20_000, None, Tiling(16, 8, 2), LEGACY),
    ("chain", 20_000, None, Tiling(32, 2, 1), LEGACY),
    ("laplacian3d", 60, 178, Tiling(8, 4, 1), DEFAULT),  # stands in for laplacian3d_100/160 (298/478 levels)
    ("laplacian2d", 500, 999, Tiling(8, 4, 1), DEFAULT),  # laplacian2d_1000/2000
    ("powerlaw", 300_000, 20499 * 3 // 40, Tiling(8, 16, 2), DEFAULT_LONG_ROWS),  # powerlaw_1M/4M: ~195 rows per level
]


@pytest.mark.parametrize("kind,size,levels,tiling,sync", BENCH_CHOICES, ids=[f"{k}_{s}" for k, s, *_ in BENCH_CHOICES])
def test_choice_on_bench_matrices(kind: str, size: int, levels: int | None, tiling: Tiling, sync: object) -> None:
    """Short rows: one-warp 8x4 + value flags; power-law: row-length tiling + 2 programs/SM; chain/band: legacy."""
    a = make(kind, size, seed=0)
    lens = torch.from_numpy(np.diff(a.indptr) - 1)
    stats = row_stats(lens, levels or _levels(a, True))
    assert choose_tiling(stats) == tiling, stats
    assert choose_sync(stats) == sync, stats
    if stats.regime != "short":  # the tiling of the first two GPU runs
        assert tiling == row_length_tiling(stats)


REGIMES = [
    ("laplacian2d", 9, "short"),
    ("laplacian3d", 5, "short"),
    ("powerlaw", 211, "long"),
    ("banded", 97, "narrow"),
    ("chain", 131, "narrow"),
]


@pytest.mark.parametrize("kind,size,regime", REGIMES)
def test_analyze_follows_the_choice(kind: str, size: int, regime: str, device: str) -> None:
    """analyze() without overrides applies the choice; tiling= and sync= still override it."""
    a = make(kind, size, seed=1)
    plan = analyze(a, device=device, tune=False)  # the heuristic's choice, not a measured one (on a GPU)
    assert plan.stats is not None and plan.stats.regime == regime and plan.info["regime"] == regime
    assert plan.tiling == choose_tiling(plan.stats) and plan.sync == choose_sync(plan.stats)
    assert plan.level_tiling == row_length_tiling(plan.stats)
    want = {"short": (Tiling(8, 4, 1), DEFAULT), "long": (plan.level_tiling, DEFAULT_LONG_ROWS), "narrow": (plan.level_tiling, LEGACY)}
    assert (plan.tiling, plan.sync) == want[regime]
    forced = analyze(a, device=device, tiling=Tiling(4, 2, 1), sync=VARIANTS["default-v1"])
    assert forced.tiling == forced.level_tiling == Tiling(4, 2, 1) and forced.sync == VARIANTS["default-v1"]
    b = _rng().standard_normal(a.shape[0])
    ref = sla.spsolve_triangular(a, b, lower=True)
    assert _rel_err(plan.solve(b), ref) < 1e-11 and _rel_err(forced.solve(b), ref) < 1e-11


def test_unit_diagonal_ignores_stored_diagonal() -> None:
    a = make("powerlaw", 90, seed=7)
    a = a.multiply(0.1).tocsr()  # keep the unit-diagonal system well conditioned
    b = _rng().standard_normal(90)
    x = sptrsv(a, b, lower=True, unit_diagonal=True)
    ref = sla.spsolve_triangular(a, b, lower=True, unit_diagonal=True)
    assert isinstance(x, np.ndarray) and _rel_err(x, ref) < 1e-11
    strict = sp.tril(a, k=-1).tocsr()  # no stored diagonal at all
    assert _rel_err(sptrsv(strict, b, unit_diagonal=True), ref) < 1e-11


def test_edges_n1_and_diagonal_only(device: str) -> None:
    one = sp.csr_matrix(np.array([[2.5]]))
    assert np.allclose(sptrsv(one, np.array([5.0])), [2.0])
    d = _rng().uniform(1, 2, 33)
    diag = sp.diags(d).tocsr()  # every row empty apart from the diagonal: one level
    b = _rng().standard_normal((33, 2))
    plan = analyze(diag, device=device, tune=False)
    assert plan.num_levels == 1
    assert np.allclose(plan.solve(b), b / d[:, None])
    empty = sp.csr_matrix((0, 0))
    assert sptrsv(empty, np.zeros(0)).shape == (0,)


def test_torch_csr_input_and_plan_reuse(device: str) -> None:
    a = make("laplacian3d", 4, seed=9).astype(np.float32)
    parts = (a.indptr.astype(np.int64), a.indices.astype(np.int64), a.data)
    t = torch.sparse_csr_tensor(*(torch.from_numpy(v).to(device) for v in parts), a.shape)
    plan = analyze(t, tune=False)  # no device given: the tensor's
    assert plan.device.type == device
    for _ in range(2):  # second solve runs with a new epoch and no reset
        b = torch.randn(a.shape[0], device=device)
        ref = sla.spsolve_triangular(a.astype(np.float64), b.double().cpu().numpy(), lower=True)
        assert _rel_err(sptrsv(plan, b).cpu().numpy(), ref) < 2e-4
    plan._epoch = 2**31 - 3  # force the counter-wraparound reset on the next solves
    for _ in range(3):
        b = torch.randn(a.shape[0], device=device)
        ref = sla.spsolve_triangular(a.astype(np.float64), b.double().cpu().numpy(), lower=True)
        assert _rel_err(plan.solve(b).cpu().numpy(), ref) < 2e-4


@pytest.mark.timeout(120)
def test_long_chain_no_deadlock(device: str) -> None:
    a = make("chain", 700, seed=4)
    b = _rng().standard_normal(700)
    plan = analyze(a, device=device, tune=False)
    assert plan.num_levels == 700
    ref = sla.spsolve_triangular(a, b, lower=True)
    assert _rel_err(plan.solve(b), ref) < 1e-11


# ---- clear errors ---------------------------------------------------------------------------


def test_error_singular() -> None:
    a = make("banded", 20, seed=1).tolil()
    a[7, 7] = 0.0
    with pytest.raises(ValueError, match="singular.*row 7"):
        analyze(a.tocsr())
    missing = sp.tril(make("chain", 10), k=-1).tocsr()
    with pytest.raises(ValueError, match="singular.*row 0"):
        sptrsv(missing, np.ones(10))


def test_error_not_triangular() -> None:
    a = make("banded", 20, seed=1).tolil()
    a[3, 9] = 1.0
    with pytest.raises(ValueError, match=r"not lower triangular.*\(3, 9\)"):
        analyze(a.tocsr())
    with pytest.raises(ValueError, match="not upper triangular"):
        analyze(make("chain", 5), lower=False)


def test_error_shapes(device: str) -> None:
    with pytest.raises(ValueError, match="square"):
        analyze(sp.random(4, 5, density=0.5, format="csr"))
    plan = analyze(make("chain", 6), device=device, tune=False)
    with pytest.raises(ValueError, match="5 rows but the matrix has 6"):
        plan.solve(np.ones(5))
    with pytest.raises(ValueError, match=r"shape \(n,\) or \(n, k\)"):
        plan.solve(np.ones((6, 2, 2)))


def test_error_dtypes(device: str) -> None:
    a = make("chain", 6)
    with pytest.raises(TypeError, match="int64 is not supported"):
        analyze(a.astype(np.int64))
    plan = analyze(a, device=device, tune=False)
    with pytest.raises(TypeError, match="float16 is not supported"):
        plan.solve(torch.ones(6, dtype=torch.float16, device=device))
    with pytest.raises(TypeError, match="differs from the matrix dtype"):
        plan.solve(np.ones(6, dtype=np.float32))
    with pytest.raises(TypeError, match="to_sparse_csr"):
        analyze(torch.eye(3))
    with pytest.raises(TypeError, match="scipy.sparse"):
        analyze([[1.0]])
    with pytest.raises(ValueError, match="unknown method"):
        sptrsv(a, np.ones(6), method="magic")


@pytest.mark.gpu
def test_gpu_large_laplacian() -> None:
    a = make("laplacian2d", 300, seed=0)
    b = np.random.default_rng().standard_normal(a.shape[0])
    x = sptrsv(a, torch.from_numpy(b).cuda()).cpu().numpy()
    assert _rel_err(x, sla.spsolve_triangular(a, b)) < 1e-11


@pytest.mark.parametrize("variant", ["default", "legacy", "tile", "mixed"])
def test_graph_twin_resets_its_workspace_every_solve(variant: str, device: str) -> None:
    """What a CUDA-graph replay of ``plan.capture`` runs: every solve is the same launch sequence
    (reset the flags and the ticket, epoch 1, ticket base 0), so repeated solves must stay right,
    and the plan's own workspace and epoch must not move."""
    from kfuse.sparse.variants import MIXED, VARIANTS

    sync = {"default": DEFAULT, "legacy": LEGACY, "tile": VARIANTS["default-v1"], "mixed": MIXED}[variant]
    a = make("powerlaw", 157, seed=5)
    plan = analyze(a, device=device, sync=sync)
    twin = plan.graph_twin()
    assert twin._done is not plan._done and twin._ticket is not plan._ticket and twin.lo is plan.lo
    for _ in range(3):
        b = _rng().standard_normal((a.shape[0], 2))
        out = torch.full(b.shape, float("nan"), dtype=torch.float64, device=device)
        x = twin.solve(torch.from_numpy(b).to(device), out=out).cpu().numpy()
        assert _rel_err(x, sla.spsolve_triangular(a, b, lower=True)) < 1e-11
    assert plan._epoch == 0 and int(plan._ticket[0]) == 0 and twin._epoch == 0


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="needs a CPU plan, whose level kernel only runs in the Triton interpreter (off on a GPU machine); "
    "the CUDA side is test_gpu_captured_solve_replays",
)
def test_capture_needs_cuda() -> None:
    plan = analyze(make("laplacian2d", 5, seed=1), device="cpu")
    with pytest.raises(RuntimeError, match="CUDA"):
        plan.capture(torch.ones(plan.n, dtype=torch.float64))


@pytest.mark.gpu
def test_gpu_captured_solve_replays() -> None:
    a = make("laplacian3d", 12, seed=0)
    plan = analyze(a, device="cuda")
    cap = plan.capture(torch.zeros(a.shape[0], dtype=torch.float64, device="cuda"))
    for _ in range(3):
        b = np.random.default_rng().standard_normal(a.shape[0])
        x = cap(torch.from_numpy(b).cuda()).cpu().numpy()
        assert x.shape == b.shape
        assert _rel_err(x, sla.spsolve_triangular(a, b)) < 1e-11


@pytest.mark.gpu
def test_gpu_analyze_tunes_by_default() -> None:
    a = make("powerlaw", 3000, seed=0)
    plan = analyze(a, device="cuda")
    assert len(plan.tuned) > 1 and plan.preprocess_ms["tune"] > 0
    assert analyze(a, device="cuda", sync=DEFAULT).tuned == {}  # an explicit choice is kept
