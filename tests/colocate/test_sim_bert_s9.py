"""The simulated replay of session 9's H200 run (BERT-base B8 S128 + hotspot): measured GEMM times and
fused-launch samples. It checks the scheduler on the shapes and overlaps the GPU measured, and records
what limits Aker there: every fusion sits at its pair's opportune ratio (the knee of the measured
samples), with the per-query allowance rarely binding, as on the GPU (96 'headroom' decisions of 57,276)."""

import pytest

from kfuse.colocate import scheduler as S
from kfuse.colocate.sim import H200_S9_BERT_SOLO_MS, h200_bert_s9, sample_law


def test_sample_law_interpolates_and_anchors() -> None:
    law = sample_law([(0.5, 1.05), (1.0, 1.6)])
    assert law(10.0, 0.0, "tail") == pytest.approx(10.0)
    assert law(10.0, 2.5, "tail") == pytest.approx(10.0 * 1.025)
    assert law(10.0, 7.5, "tail") == pytest.approx(10.0 * 1.325)
    assert law(10.0, 20.0, "tail") == pytest.approx(10.0 * 2.6)  # slope 1 past the last sample


def test_replay_has_the_measured_structure() -> None:
    sim = h200_bert_s9(noise=0.0)
    assert len(sim.lc_ms) == 86 and sum(sim.fusible) == 49
    assert sum(sim.lc_ms) == pytest.approx(H200_S9_BERT_SOLO_MS)


def test_aker_gains_over_time_sharing_with_qos_kept_and_fuses_at_the_knees() -> None:
    sim = h200_bert_s9(noise=0.05)
    prof = S.build_profile(sim, ["hotspot"], ["tail"], reps=2)
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    extra = S.extra_budget(prof, qos, rate)
    seqs = [S.poisson_arrivals(rate, 150, s) for s in range(2)]
    ts = S.merge_runs([S.run_policy(sim, prof, "timeshare", a, ["hotspot"], qos, extra_per_query_ms=extra) for a in seqs])
    ak = S.merge_runs([S.run_policy(sim, prof, "aker", a, ["hotspot"], qos, extra_per_query_ms=extra) for a in seqs])
    assert ak.p99 <= qos and ts.p99 <= qos
    assert ak.be_throughput > 1.05 * ts.be_throughput  # the GPU measured +9.0%; this replay gives ~+16%
    # 0.9 until session 13; with samples at the fit's x for their blocks (no noisy measured x), the noisy launches
    # refuse more slices for efficiency (3,302 of 14,700 here) at the same gain (+14.3% both)
    assert ak.decisions["fused"] > 0.75 * 49 * 300
    assert ak.decisions.get("headroom", 0) < 0.05 * ak.decisions["fused"]  # the allowance rarely binds
    for (key, _), sel in prof.chosen.items():  # every slice aims at a knee below x = 1
        assert 0.1 < sel.opportune_ratio < 1.0, key
