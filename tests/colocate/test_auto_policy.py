"""The ``auto`` policy: at each query's start, the whole-query SM partition where its planned gain beats what Aker's
per-kernel fusions plan for the same query, else Aker for that query. On a simulated BERT-like GPU it follows the
mechanism that pays: the partition where the query keeps its speed on fewer SMs, Aker where the fused kernels overlap
and the partition slows the query past its allowance."""

import pytest

from kfuse.colocate import scheduler as S
from kfuse.colocate.fuser import green
from kfuse.colocate.sim import SimGPU, bert_s9_partitioned, overlap_law, partition_law

POLICIES = ("timeshare", "aker", "partition", "auto")


def _bert_like(span_slowdown: float, fused_overlap: float) -> SimGPU:
    """BERT-base B8 S128 with sgemm (``sim.bert_s9_partitioned``): the 1:2 fused version overlaps by ``fused_overlap``,
    the per-kernel partition version doubles the LC kernel (never chosen), the whole query on the 84 SMs a 48-SM
    partition leaves takes ``span_slowdown`` x its time."""
    laws = {(1, 2): overlap_law(fused_overlap), green(48): partition_law(48 / 132, 2.0, 0.0047)}
    return bert_s9_partitioned(laws, 0.02, {48: span_slowdown})


def _runs(span_slowdown: float, fused_overlap: float) -> tuple[dict[str, S.RunResult], float]:
    sim = _bert_like(span_slowdown, fused_overlap)
    prof = S.build_profile(sim, ["sgemm"], [(1, 2), green(48)], reps=1, span_sms=[48])
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    arrivals = S.poisson_arrivals(rate, 300, 1)
    extra = S.extra_budget(prof, qos, rate)
    return {p: S.run_policy(sim, prof, p, arrivals, ["sgemm"], qos, extra_per_query_ms=extra) for p in POLICIES}, qos


def test_auto_takes_the_partition_where_the_query_keeps_its_speed() -> None:
    r, qos = _runs(1.0, 0.0)
    auto, pa, ts = r["auto"], r["partition"], r["timeshare"]
    assert pa.be_throughput > 1.2 * ts.be_throughput and r["aker"].be_throughput < 1.05 * ts.be_throughput
    assert auto.decisions.get("auto_span", 0) > 0.9 * len(auto.latencies_ms)
    assert auto.be_throughput >= 0.97 * pa.be_throughput
    assert auto.violations == 0 and auto.p99 <= qos


def test_auto_takes_aker_where_the_partition_slows_the_query() -> None:
    r, qos = _runs(1.3, 0.3)
    auto, ak, ts = r["auto"], r["aker"], r["timeshare"]
    assert ak.be_throughput > 1.05 * ts.be_throughput and r["partition"].decisions.get("span", 0) == 0
    assert auto.decisions.get("auto_span", 0) == 0 and auto.decisions.get("auto_aker", 0) == len(auto.latencies_ms)
    assert auto.be_throughput == pytest.approx(ak.be_throughput, rel=0.03)
    assert auto.fused_launches > 0 and auto.violations == 0 and auto.p99 <= qos


def test_aker_query_gain_counts_each_fusion_against_the_headroom_left() -> None:
    sim = _bert_like(1.0, 0.3)
    prof = S.build_profile(sim, ["sgemm"], [(1, 2), green(48)], reps=1, span_sms=[48])
    assert S.aker_query_gain(prof, prof.fused, "sgemm", 0.0) == 0.0  # no headroom: no fusion
    small, large = (S.aker_query_gain(prof, prof.fused, "sgemm", h) for h in (0.02, 0.5))
    assert 0.0 < small < large


def test_auto_is_a_policy_the_cli_knows() -> None:
    assert "auto" in S.POLICIES


def test_cli_runs_the_policies_asked_for(colocate_cli) -> None:  # noqa: ANN001
    r, seen, recs = colocate_cli("green32,1:2", "--policies", "timeshare,auto")
    assert r.exit_code == 0, r.output
    assert seen["policies"] == ["timeshare", "auto"]
    assert {rec["policy"] for rec in recs} <= {"timeshare", "auto"} and any(rec["policy"] == "timeshare" for rec in recs)
    assert all(rec["command"].endswith("--policies timeshare,auto") for rec in recs)
    bad, _, _ = colocate_cli("green32,1:2", "--policies", "timeshare,fastest")
    assert bad.exit_code != 0 and "fastest" in bad.output


def _partition_gain(contention: float) -> tuple[float, float]:
    """BE throughput of the partition policy over time sharing, and the mean slice in BE kernels, on the BERT-like GPU
    with a 32-SM BE partition and ``contention``: the query's extra time per BE kernel's worth of blocks beside it."""
    sim = _bert_like(1.0, 0.0)
    sim.span_slowdown, sim.span_contention = {32: 1.0}, {"sgemm": contention}
    prof = S.build_profile(sim, ["sgemm"], [green(32)], reps=1, span_sms=[32], max_fuse_keys=0)
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    arrivals = S.poisson_arrivals(rate, 300, 1)
    extra = S.extra_budget(prof, qos, rate)
    ts, pa = (S.run_policy(sim, prof, p, arrivals, ["sgemm"], qos, extra_per_query_ms=extra) for p in ("timeshare", "partition"))
    spans = [x for kind, x in sim.launches if kind == "span" and x[3]]
    mean_slice = sum(end - start for _, start, end, _ in spans[-len(arrivals) :]) / max(1, len(arrivals)) / prof.be_blocks["sgemm"]
    return pa.be_throughput / ts.be_throughput - 1.0, mean_slice


def test_contention_beside_the_query_shrinks_the_slices_and_the_gain() -> None:
    # the H100's measured contention (session 51: mri-q ~0.013, hotspot ~0.05 a kernel's worth) costs the partition
    # ~1 and ~4 points here (23% -> 22% -> 19%); past the allowance no span is taken. It is not all of the gap to the
    # measured +4..+9%: the BE's rate per SM on a partition is also below its whole-GPU rate (docs/perf-notes.md)
    free, mriq_like, hotspot_like, heavy = (_partition_gain(c) for c in (0.0, 0.013, 0.05, 0.5))
    assert free[0] > mriq_like[0] > hotspot_like[0] > heavy[0]
    assert free[0] > 0.15 and heavy[0] < 0.03 and heavy[1] < free[1]


def test_partition_ceiling_is_the_lc_busy_share_over_the_rest_times_the_share_of_sms() -> None:
    # session 51's BERT-base run on an H100: 332.6 queries/s of 1.413 ms, 32 of 132 SMs -> +21%
    assert S.partition_ceiling(332.6, 1.413, 32, 132) == pytest.approx(0.47 / 0.53 * 32 / 132, rel=0.01)
    assert S.partition_ceiling(100.0, 1.0, 0, 132) == 0.0
    with pytest.raises(ValueError, match="busy share"):
        S.partition_ceiling(1000.0, 1.0, 32, 132)  # the LC alone fills the GPU


def test_the_experiment_reports_the_ceiling_beside_the_partition_run() -> None:
    from kfuse.colocate import experiment

    sim = _bert_like(1.0, 0.0)
    res = experiment.run_experiment(sim, ["sgemm"], seconds=0.05, min_queries=40, max_queries=40, versions=[green(48)],
                                    policies=["timeshare", "partition"], reps=1, log=lambda m: None)  # fmt: skip
    ceiling = res["partition_ceiling"][48]
    rho = res["rate"] * res["solo_ms"] / 1000.0
    assert ceiling == pytest.approx(rho / (1 - rho) * 48 / 132)
    recs = experiment.records(res, "bert-like", "test")
    assert [r["partition_ceiling"] for r in recs if r["policy"] == "partition"] == [{48: ceiling}]
