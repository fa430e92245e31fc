"""Guards of the sparse solver: tuning never keeps a wrong variant, ``out`` must have the result's
shape, and ``sptrsv(plan, ...)`` refuses flags that contradict the plan (the interpreter on the CPU, the
compiled kernels on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as sla
import torch

import kfuse.sparse.tune as T
from kfuse.sparse import analyze, sptrsv
from kfuse.sparse.levelset import levelset_solve
from kfuse.sparse.matrices import make


def _lower(n: int = 7) -> sp.csr_matrix:
    rng = np.random.default_rng(0)
    a = sp.tril(sp.random(n, n, density=0.4, random_state=1), -1).tocsr() + sp.diags(rng.uniform(1, 2, n))
    return a.tocsr()


def test_tune_raises_when_every_candidate_is_wrong(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    plan = analyze(make("laplacian2d", 9, seed=0), device=device, tune=False)
    assert len(T.candidates(plan.stats)) > 1
    monkeypatch.setattr(T, "backward_error", lambda plan, b, x: 1.0)  # every variant computes a wrong x
    with pytest.raises(RuntimeError, match="no kernel variant solves this system correctly") as e:
        T.tune(plan, timer=lambda fn: (fn(), 1.0)[1])
    assert "backward error 1.0e+00" in str(e.value)
    with pytest.raises(RuntimeError, match="no kernel variant"):  # analyze(tune=True) surfaces it
        analyze(make("laplacian2d", 9, seed=0), device=device, tune=True)


def test_single_candidate_is_checked(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    plan = analyze(make("chain", 40, seed=2), device=device, tune=False)
    cands = T.candidates(plan.stats)
    assert len(cands) == 1
    got = T.tune(plan, timer=lambda fn: pytest.fail("a single candidate is not timed"))
    assert got == {T.label(cands[0]): "correct, not timed (the only candidate)"}
    assert (plan.sync, plan.tiling) == cands[0]
    solve = plan.solve

    def wrong(b, out=None, sync=None, tiling=None):  # noqa: ANN001, ANN202
        return solve(b, out=out, sync=sync, tiling=tiling).add_(1.0)

    monkeypatch.setattr(plan, "solve", wrong)
    with pytest.raises(RuntimeError, match="backward error"):
        T.tune(plan)


def test_out_must_have_the_right_hand_sides_shape(device: str) -> None:
    a = _lower()
    plan = analyze(a, device=device, tune=False)
    b_np = np.random.default_rng(1).standard_normal((7, 2))
    b = torch.from_numpy(b_np).to(device)
    f64 = dict(dtype=torch.float64, device=device)  # every out on b's device: only its shape is wrong
    for solve in (plan.solve, lambda bb, out: levelset_solve(plan, bb, out=out)):
        with pytest.raises(ValueError, match=r"shape \(7, 2\)"):
            solve(b, out=torch.empty(2, 7, **f64))
        with pytest.raises(ValueError, match="shape"):
            solve(b, out=torch.empty(14, **f64))
        out = torch.full((7, 2), float("nan"), **f64)
        x = solve(b, out=out)
        assert x is out and np.abs(x.cpu().numpy() - sla.spsolve_triangular(a, b_np)).max() < 1e-12
    b1 = b[:, 0].contiguous()
    for shape in ((7,), (7, 1)):  # a vector right-hand side: (n,) or (n, 1)
        out = torch.empty(shape, **f64)
        assert plan.solve(b1, out=out) is out
    with pytest.raises(ValueError, match="shape"):
        plan.solve(b1, out=torch.empty(1, 7, **f64))
    with pytest.raises(ValueError, match="not contiguous"):
        plan.solve(b, out=torch.empty(2, 7, **f64).t())


def test_sptrsv_flags_must_agree_with_the_plan(device: str) -> None:
    a = _lower()
    plan = analyze(a, device=device, tune=False)
    b = np.random.default_rng(2).standard_normal(7)
    ref = sla.spsolve_triangular(a, b, lower=True)
    with pytest.raises(ValueError, match="lower=False contradicts the plan"):
        sptrsv(plan, b, lower=False)
    with pytest.raises(ValueError, match="unit_diagonal=True contradicts the plan"):
        sptrsv(plan, b, unit_diagonal=True)
    with pytest.raises(ValueError, match="lower=False"):
        sptrsv(plan, b, lower=False, method="levelset")
    for kw in ({}, {"lower": True}, {"unit_diagonal": False}, {"lower": True, "unit_diagonal": False}):
        assert np.abs(sptrsv(plan, b, **kw) - ref).max() < 1e-12
    upper = analyze(a.T.tocsr(), lower=False, device=device, tune=False)
    assert np.abs(sptrsv(upper, b) - sla.spsolve_triangular(a.T.tocsr(), b, lower=False)).max() < 1e-12
    with pytest.raises(ValueError, match="lower=True contradicts"):
        sptrsv(upper, b, lower=True)
    # a matrix (not a plan) keeps the defaults lower=True, unit_diagonal=False
    assert np.abs(sptrsv(a, b) - ref).max() < 1e-12


def test_a_cpu_matrix_without_the_interpreter_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU machine (no interpreter) a CPU matrix reached Triton's "cpu tensor?" launch error."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA device, or on the CPU in the Triton interpreter"):
        analyze(make("laplacian2d", 5, seed=0), device="cpu")
