"""The measured choice of variant and tiling (``kfuse.sparse.tune``), in the interpreter on the CPU and
with the compiled kernels on a GPU.

Times on the CPU mean nothing, so a fake timer decides which candidate is fastest (on a GPU too, so
that the outcome is known); the tests check that the fastest *correct* candidate is kept, a wrong or
failing one never is, and that the tuned plan still solves right. The plans start untuned
(``tune=False``: ``analyze`` would tune by default on a GPU, with the real timer)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse.linalg as sla
import torch

from kfuse.sparse import analyze
from kfuse.sparse.analysis import row_stats
from kfuse.sparse.matrices import make
from kfuse.sparse.tune import candidates, label, tune


def _plan(kind: str, size: int, device: str):  # noqa: ANN202
    a = make(kind, size, seed=2)
    return a, analyze(a, device=device, tune=False)


@pytest.mark.parametrize("kind,size,regime,n", [("laplacian2d", 9, "short", 3), ("powerlaw", 300, "long", 4), ("chain", 40, "narrow", 1)])
def test_candidates_per_regime(kind: str, size: int, regime: str, n: int, device: str) -> None:
    a, plan = _plan(kind, size, device)
    assert plan.stats.regime == regime and plan.tuned == {}
    cands = candidates(plan.stats)
    assert len(cands) == n and cands[0] == (plan.sync, plan.tiling)  # the heuristic comes first
    assert len({label(c) for c in cands}) == n
    # by default analyze() tunes on a GPU only, over these candidates (each timed, or checked when alone)
    tuned = analyze(a, device=device).tuned
    assert set(tuned) == ({label(c) for c in cands} if device == "cuda" else set()), tuned


def test_fastest_correct_candidate_is_kept(device: str) -> None:
    a, plan = _plan("powerlaw", 300, device)
    cands = candidates(plan.stats)
    order = iter([5.0, 5.0, 5.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 9.0])  # the second candidate is fastest
    got = tune(plan, cands, timer=lambda fn: (fn(), next(order))[1])
    assert got[label(cands[1])] == 1.0 and (plan.sync, plan.tiling) == cands[1]
    assert got[label(cands[3])] == 9.0  # 3x slower than the best after one solve: not repeated
    b = np.random.default_rng().standard_normal(a.shape[0])
    x = plan.solve(torch.from_numpy(b).to(device)).cpu().numpy()
    assert np.abs(x - sla.spsolve_triangular(a, b)).max() / np.abs(x).max() < 1e-11


def test_wrong_or_failing_candidate_is_never_chosen(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    _, plan = _plan("laplacian2d", 9, device)
    cands = candidates(plan.stats)
    solve = plan.solve

    def broken(b, out=None, sync=None, tiling=None):  # noqa: ANN001, ANN202
        if tiling == cands[1][1] and sync == cands[1][0]:
            y = solve(b, out=out, sync=sync, tiling=tiling)
            y.add_(1.0)  # a wrong answer
            return y
        if sync == cands[2][0]:
            raise RuntimeError("no such kernel here")
        return solve(b, out=out, sync=sync, tiling=tiling)

    monkeypatch.setattr(plan, "solve", broken)
    times = iter([4.0, 4.0, 4.0])
    got = tune(plan, cands, timer=lambda fn: (fn(), next(times))[1])
    assert str(got[label(cands[1])]).startswith("failed: backward error")
    assert str(got[label(cands[2])]).startswith("failed: RuntimeError")
    assert (plan.sync, plan.tiling) == cands[0]


def test_a_wrong_first_candidate_is_not_the_reference(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """Every candidate is checked against the system (its backward error), so a wrong answer from
    the first candidate neither wins nor fails the correct ones."""
    _, plan = _plan("laplacian2d", 9, device)
    cands = candidates(plan.stats)
    solve = plan.solve

    def first_wrong(b, out=None, sync=None, tiling=None):  # noqa: ANN001, ANN202
        y = solve(b, out=out, sync=sync, tiling=tiling)
        if (sync, tiling) == cands[0]:
            y[3] += 0.5  # one wrong element
        return y

    monkeypatch.setattr(plan, "solve", first_wrong)
    times = iter([1.0] + [4.0] * 20)  # the wrong candidate would also be the fastest
    got = tune(plan, cands, timer=lambda fn: (fn(), next(times))[1])
    assert str(got[label(cands[0])]).startswith("failed: backward error")
    assert all(isinstance(got[label(c)], float) for c in cands[1:]) and (plan.sync, plan.tiling) != cands[0]


def test_backward_error_of_right_and_wrong_solutions(device: str) -> None:
    from kfuse.sparse.tune import backward_error

    _, plan = _plan("laplacian2d", 9, device)
    b = torch.randn(plan.n, 1, dtype=plan.dtype, device=device)
    x = plan.solve(b)
    assert backward_error(plan, b, x) < 1e-6
    x[plan.n // 2] += 1e-2
    assert backward_error(plan, b, x) > 1e-4
    x[0] = float("nan")
    assert backward_error(plan, b, x) != backward_error(plan, b, x)  # NaN


def test_tune_flag_in_analyze_records_times(device: str) -> None:
    a = make("laplacian2d", 9, seed=1)
    plan = analyze(a, device=device, tune=True)
    stats = row_stats(plan.lo.rowptr[1:] - plan.lo.rowptr[:-1], plan.num_levels)
    assert stats.regime == "short" and set(plan.tuned) == {label(c) for c in candidates(stats)}
    assert all(isinstance(v, float) for v in plan.tuned.values()) and plan.preprocess_ms["tune"] > 0


def test_an_explicit_choice_is_measured_first(device: str) -> None:
    from kfuse.sparse.variants import LEGACY

    a = make("laplacian2d", 9, seed=4)
    plan = analyze(a, device=device, sync=LEGACY, tune=True)
    first = next(iter(plan.tuned))
    assert first.startswith(LEGACY.name + "@") and len(plan.tuned) == 4  # LEGACY, then the regime's three
