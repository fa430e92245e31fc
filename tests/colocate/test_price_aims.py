"""Pricing the per-query allowance (``Profile.price_aims``): E solved so one query's slices fit the allowance,
slices aimed where the marginal BE time per ms of extra falls to E, and the gain on a simulated GPU where the
allowance binds."""

from __future__ import annotations

import pytest

import kfuse.colocate.predictor as P
import kfuse.colocate.scheduler as S
from kfuse.colocate.sim import bert_replay

# a histogram-like curve (session 12, 1024x2304x768 + histogram, ``tail``): nearly free to x = 0.92, then
# about 2 ms of extra for every 2.2 ms of BE work
CHEAP_THEN_STEEP = [(0.43, 0.986), (0.67, 0.980), (0.92, 1.004), (1.16, 1.045), (1.66, 1.288), (2.14, 1.529), (2.64, 1.778),
                    (3.14, 2.027), (4.12, 2.505)]  # fmt: skip
# a hotspot-like curve (1024x768x768, ``tail``): cheap only at small x
CHEAP_ONLY_SMALL = [(0.42, 1.022), (0.52, 1.119), (0.79, 1.302), (1.01, 1.460), (1.35, 1.736), (1.82, 2.204), (2.27, 2.940)]


def _profile(curve: list[tuple[float, float]], n: int = 10, t: float = 0.02) -> S.Profile:
    lc = [S.LCKernel(f"g{i}", True, "gemm") for i in range(n)] + [S.LCKernel("seg", False, "seg")]
    xs, ys = zip(*curve, strict=True)
    fused = {("gemm", "be"): {"tail": P.OnlineTwoStage.from_samples(xs, ys)}}
    prof = S.Profile([t] * n + [0.05], lc, {"be": P.LinearModel(0.001, 1e-5)}, {"be": 10_000}, fused)
    prof.samples = {("gemm", "be"): {"tail": list(curve)}}
    prof.choose()
    return prof


def _spend(prof: S.Profile, e: float) -> float:
    m = prof.fused[("gemm", "be")]["tail"].model
    x = m.aim(e)
    return sum(t * (m.g(x) - 1.0) for t, k in zip(prof.lc_ms, prof.lc, strict=True) if k.fusible)


@pytest.mark.parametrize("allowance", [0.0005, 0.003, 0.01, 0.05, 1.0])
def test_the_price_is_the_smallest_on_the_grid_whose_slices_fit_the_allowance(allowance: float) -> None:
    prof = _profile(CHEAP_THEN_STEEP)
    e = prof.price_aims("be", allowance)
    assert e in S.PRICE_GRID
    assert _spend(prof, e) <= allowance or e == S.PRICE_GRID[-1]
    k = S.PRICE_GRID.index(e)
    if k > 0:  # one step cheaper would overspend
        assert _spend(prof, S.PRICE_GRID[k - 1]) > allowance
    sel = prof.chosen[("gemm", "be")]
    assert sel.opportune_ratio == prof.fused[("gemm", "be")]["tail"].model.aim(e)


def test_a_tight_allowance_aims_at_the_cheap_part_and_a_loose_one_at_the_largest_saving() -> None:
    prof = _profile(CHEAP_THEN_STEEP)
    assert prof.price_aims("be", 0.0005) >= 5.0
    assert prof.chosen[("gemm", "be")].opportune_ratio <= 1.16  # 0.92 or 1.16: nearly free slices
    assert prof.price_aims("be", 10.0) == 1.0
    assert prof.chosen[("gemm", "be")].opportune_ratio == pytest.approx(4.12)  # largest 1 + x - y


def test_unprice_restores_the_global_rule_and_a_refit_keeps_the_price() -> None:
    prof = _profile(CHEAP_THEN_STEEP)
    average = prof.chosen[("gemm", "be")].opportune_ratio
    e = prof.price_aims("be", 0.003)
    online = prof.fused[("gemm", "be")]["tail"]
    online.observe(0.02, 0.02 * 0.92, 0.02 * 1.5)  # far off: a refit
    assert online.refits == 1 and online.model.efficiency == e
    prof.unprice("be")
    assert prof.fused[("gemm", "be")]["tail"].model.efficiency is None
    assert prof.chosen[("gemm", "be")].opportune_ratio == pytest.approx(prof.fused[("gemm", "be")]["tail"].model.opportune_ratio)
    assert average == pytest.approx(3.14)


def test_pricing_lifts_an_allowance_bound_pair_and_keeps_the_others_on_the_simulated_gpu() -> None:
    """BERT-base on the simulated GPU with each curve on every GEMM shape: where the allowance binds (cheap
    then steep), priced slices buy far more BE work than the average rule's; where it does not, no less
    (within the simulated launch noise). QoS holds in both."""
    gemms = {"1024x2304x768": 0.0161, "1024x768x768": 0.0107, "1024x3072x768": 0.0160, "1024x768x3072": 0.0280}
    pooler = ("8x768x768", 0.0100)
    gains = {}
    for name, curve, be in (("steep", CHEAP_THEN_STEEP, ("hist", (0.0011, 2.24e-5, 32768))),
                            ("small", CHEAP_ONLY_SMALL, ("hot", (0.0034, 8.1e-6, 16384)))):  # fmt: skip
        samples = {"tail": {k: curve for k in [*gemms, pooler[0]]}}
        sim = bert_replay(gemms, pooler, 1.09, samples, be=be)
        prof = S.build_profile(sim, [be[0]], ["tail"], reps=2)
        qos = 5 * prof.lc_total
        rate = 0.8 * S.max_lc_rate(prof, qos)
        extra = S.extra_budget(prof, qos, rate)
        arrivals = S.poisson_arrivals(rate, 80, 0)
        ts = S.run_policy(sim, prof, "timeshare", arrivals, [be[0]], qos, extra_per_query_ms=extra)
        avg = S.run_policy(sim, prof, "aker", arrivals, [be[0]], qos, extra_per_query_ms=extra)
        prof.price_aims(be[0], extra)
        priced = S.run_policy(sim, prof, "aker", arrivals, [be[0]], qos, extra_per_query_ms=extra)
        assert avg.violations == 0 and priced.violations == 0
        gains[name] = (avg.be_throughput / ts.be_throughput - 1.0, priced.be_throughput / ts.be_throughput - 1.0)
    assert gains["steep"][1] > gains["steep"][0] + 0.10, gains
    assert gains["small"][1] > gains["small"][0] - 0.03, gains
