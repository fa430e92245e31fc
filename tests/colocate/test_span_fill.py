"""The partition's backfill: BE blocks on the query's own SMs at low priority during a whole-query span
(``run_span(..., fill)``, ``Profile.filled_spans``, ``span_plan``), on the simulated GPU and the CUDA backend
(which runs in order without a GPU, and with real partitions and priorities on one)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from kfuse.colocate import scheduler as S
from kfuse.colocate.fuser import green
from kfuse.colocate.sim import SimGPU, bert_s9_partitioned, partition_law

BE_SMS = 32


def _bert(span_idle: float, fill_contention: float = 0.0) -> SimGPU:
    """BERT-base B8 S128 with sgemm on a 32-SM partition; the query leaves ``span_idle`` of its own SMs' time idle, and
    each whole sgemm kernel's worth of backfill slows it by ``fill_contention``."""
    sim = bert_s9_partitioned(partition_law(BE_SMS / 132, 1.0, 0.0047), 0.02, {BE_SMS: 1.0})
    sim.span_idle = span_idle
    sim.fill_contention = {"sgemm": fill_contention}
    return sim


def _runs(sim: SimGPU, fill: bool) -> tuple[dict[str, S.RunResult], S.Profile, float]:
    prof = S.build_profile(sim, ["sgemm"], [green(BE_SMS)], reps=1, span_sms=[BE_SMS], max_fuse_keys=0,
                           fill_shares=S.FILL_SHARES if fill else ())  # fmt: skip
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    arrivals = S.poisson_arrivals(rate, 300, 1)
    extra = S.extra_budget(prof, qos, rate)
    pols = ("timeshare", "partition", "backfill")
    runs = {p: S.run_policy(sim, prof, p, arrivals, ["sgemm"], qos, extra_per_query_ms=extra) for p in pols}
    return runs, prof, qos


def test_backfills_are_profiled_per_share_with_the_same_slices() -> None:
    _, prof, _ = _runs(_bert(0.2), fill=True)
    fills = sorted(m for (b, s, m) in prof.filled_spans if b == "sgemm" and s == BE_SMS)
    assert len(fills) == len(S.FILL_SHARES) and fills[0] > 0 and fills == sorted(set(fills))
    for m in fills:
        pts = prof.filled_spans[("sgemm", BE_SMS, m)]
        assert [n for n, _ in pts] == [n for n, _ in prof.spans[("sgemm", BE_SMS)]]  # the same slice sizes
        assert all(t >= 0.9 * prof.span_solo_ms for _, t in pts)


def test_the_backfill_policy_takes_backfills_where_the_query_leaves_its_sms_idle() -> None:
    """20% of the query's SMs' time idle, backfill free of contention: on one profile and one arrival sequence,
    ``backfill`` adds backfill to the slices and gains over ``partition`` (which keeps to the slices), QoS kept; with
    no backfill profiled, ``backfill`` is ``partition``."""
    runs, _, qos = _runs(_bert(0.2), fill=True)
    pa, pf = runs["partition"], runs["backfill"]
    assert not any("+fill" in k for k in pa.fused_by_key) and any("+fill" in k for k in pf.fused_by_key)
    assert pf.be_throughput >= 1.05 * pa.be_throughput
    assert pf.violations == 0 and pf.p99 <= qos
    plain, _, _ = _runs(_bert(0.2), fill=False)
    assert plain["backfill"].decisions == plain["partition"].decisions  # the same plans (the simulator's noise differs)
    assert plain["backfill"].be_throughput == pytest.approx(plain["partition"].be_throughput, rel=0.02)
    assert plain["partition"].be_throughput == pytest.approx(pa.be_throughput, rel=0.02)


def test_backfill_that_slows_the_query_is_not_taken() -> None:
    """No idle time on the query's SMs: every backfilled block runs after the query and lengthens its window, so no
    plan takes one, and ``backfill`` is the partition without it."""
    runs, _, _ = _runs(_bert(0.0, fill_contention=0.5), fill=True)
    assert not any("+fill" in k for k in runs["backfill"].fused_by_key)
    assert runs["backfill"].decisions == runs["partition"].decisions
    assert runs["backfill"].be_throughput == pytest.approx(runs["partition"].be_throughput, rel=0.02)


def test_span_plan_fits_slice_and_backfill_into_the_head_kernel_when_other_jobs_wait() -> None:
    _, prof, _ = _runs(_bert(0.2), fill=True)
    left = prof.be_blocks["sgemm"] // 3
    cut = S.span_plan(prof, "sgemm", left, 1.0, run_on=False)
    assert cut is not None and cut.blocks + cut.fill <= left
    on = S.span_plan(prof, "sgemm", left, 1.0, run_on=True)
    assert on is not None and on.blocks + on.fill > left and on.gain_ms >= cut.gain_ms
    assert S.span_plan(prof, "sgemm", left, 1.0, fill=False).fill == 0  # the partition policy's plan


def test_a_span_with_backfill_runs_every_block_once_on_the_cuda_backend(gemm_lc_backend: Callable[[str], SimpleNamespace]) -> None:
    t = gemm_lc_backend("histogram")
    a, b, c, w, expect_be, backend = t.a, t.b, t.c, t.w, t.expect_be, t.backend
    n = w.kernel.n_blocks
    sms = max(1, backend.sms // 4)
    # a slice of the middle half of an instance, then a backfill of its last quarter, a whole instance and the first
    # quarter of a third: two instances' worth of blocks from n/4, so every block exactly twice
    backend.run_span("histogram", n // 4, n // 4 + n // 2, sms, n // 4 + n + n // 4)
    assert torch.allclose(c.cpu().float(), a.cpu().float() @ b.cpu().float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(w.output(), 2 * expect_be)
    w.reset()
    backend.run_span("histogram", 0, n // 2, sms, n // 2 + n)  # the slice and its backfill: exactly two instances
    assert torch.equal(w.output(), 2 * expect_be)


def test_cli_span_fill_profiles_backfills_and_runs_the_backfill_policy(colocate_cli) -> None:  # noqa: ANN001
    r, seen, recs = colocate_cli("green32", "--policies", "timeshare,partition,backfill", "--span-fill")
    assert r.exit_code == 0, r.output
    assert seen["span_fill"] is True and "--span-fill" in recs[0]["command"]
    assert {rec["policy"] for rec in recs} == {"timeshare", "partition", "backfill"}
    # without --span-fill there is no backfill profiled, so the backfill policy is not run
    r, seen, recs = colocate_cli("green32", "--policies", "timeshare,backfill")
    assert r.exit_code == 0, r.output
    assert seen["span_fill"] is False and {rec["policy"] for rec in recs} == {"timeshare"}


def _resnet_like(span_idle: float) -> SimGPU:
    """An LC that a partition slows so much that no slice pays: the query on the 100 SMs a 32-SM partition leaves takes
    30% longer (ResNet-50 B32 on the H100, session 52: +5-6% with no BE blocks, +17% with mri-q's smallest slice)."""
    sim = _bert(span_idle)
    sim.span_slowdown = {BE_SMS: 1.3}
    return sim


def test_the_backfill_alone_serves_an_lc_that_a_partition_slows() -> None:
    """Where a partition costs the query more than its slice gains, ``partition`` plans no span; ``backfill`` still
    puts BE blocks in the query's idle share with the query on every SM (BE SM count 0, no slice)."""
    runs, prof, qos = _runs(_resnet_like(0.15), fill=True)
    assert any(s == 0 and m > 0 and len(pts) == 1 for (_, s, m), pts in prof.filled_spans.items())
    assert runs["partition"].decisions.get("span", 0) == 0
    keys = runs["backfill"].fused_by_key
    assert keys and all(k.startswith("query|sgemm|span0+fill") for k in keys)
    assert runs["backfill"].be_throughput >= 1.04 * runs["partition"].be_throughput
    assert runs["backfill"].violations == 0 and runs["backfill"].p99 <= qos


def test_the_backfill_alone_runs_every_block_once_on_the_cuda_backend(gemm_lc_backend: Callable[[str], SimpleNamespace]) -> None:
    t = gemm_lc_backend("histogram")
    a, b, c, w, expect_be, backend = t.a, t.b, t.c, t.w, t.expect_be, t.backend
    n = w.kernel.n_blocks
    backend.run_span("histogram", n // 3, n // 3, 0, 2 * n)  # no slice; the backfill from block n/3 over two instances
    assert torch.allclose(c.cpu().float(), a.cpu().float() @ b.cpu().float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(w.output(), 2 * expect_be)


def test_cli_span_fill_without_a_partition_profiles_the_backfill_alone(colocate_cli) -> None:  # noqa: ANN001
    r, seen, recs = colocate_cli("1:2", "--policies", "timeshare,partition,backfill", "--span-fill")
    assert r.exit_code == 0, r.output
    assert {rec["policy"] for rec in recs} == {"timeshare", "backfill"}  # no green<S>: no partition to run


def test_an_experiment_with_a_partition_larger_than_the_gpu_reports_no_ceiling_for_it() -> None:
    """A smoke run asks for green32 on the interpreter's few SMs: the experiment runs, with no ceiling for a partition
    the GPU does not have (it raised before)."""
    from kfuse.colocate.experiment import run_experiment

    sim = _bert(0.1)
    sim.sms = 16
    out = run_experiment(sim, ["sgemm"], versions=[green(BE_SMS), green(8)], policies=("lc_alone", "timeshare", "partition"),
                         seconds=0.05, min_queries=8, max_queries=8, reps=1, log=lambda m: None, max_fuse_keys=0)  # fmt: skip
    assert set(out["partition_ceiling"]) == {8}
    assert ("sgemm", "partition") in out["runs"]


# the query's extra time with a backfill of 10% of its SMs' time, measured (H100, session 53, ResNet-50 B32):
# pathfinder 0.044 ms and sgemm 0.162 ms of a 1.516 ms query
@pytest.mark.parametrize(("be_like", "extra_per_10pct", "taken"), [("pathfinder", 0.029, True), ("sgemm", 0.107, False)])
def test_a_backfill_is_taken_where_its_measured_cost_to_the_query_is_low(be_like: str, extra_per_10pct: float, taken: bool) -> None:
    """What a backfill costs the query is what its blocks contend for on the query's SMs (session 53 refuted a fixed
    wait per kernel start). With pathfinder's measured cost the idle share pays; with sgemm's the plan keeps to the
    slices, and ``backfill`` runs the partition's plans."""
    _, prof, _ = _runs(_bert(0.2), fill=True)
    fill_10 = min(m for (b, s, m) in prof.filled_spans if b == "sgemm" and s == BE_SMS)  # the 10% share's blocks
    sim = _bert(0.2, fill_contention=extra_per_10pct * prof.be_blocks["sgemm"] / fill_10)
    runs, _, qos = _runs(sim, fill=True)
    assert any("+fill" in k for k in runs["backfill"].fused_by_key) is taken
    assert runs["backfill"].violations == 0 and runs["backfill"].p99 <= qos
    if not taken:
        assert runs["backfill"].decisions == runs["partition"].decisions


def test_a_quarter_slice_is_sampled_so_a_dear_partition_still_plans_a_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """ResNet-50 B32 on the H100 (session 53): the smallest slice sampled, half the window's fill, cost the query more
    than its allowance, so the partition never planned a span. With a quarter-fill sample (``SPAN_FILL``) it does
    where the slice's cost is about proportional to its blocks (here 10% of the query per whole kernel of blocks)."""
    assert min(S.SPAN_FILL) == 0.25

    def partition_run(fills: tuple[float, ...]) -> tuple[S.RunResult, S.RunResult]:
        monkeypatch.setattr(S, "SPAN_FILL", fills)
        sim = _bert(0.0)
        sim.span_contention = {"sgemm": 0.1}
        runs, _, qos = _runs(sim, fill=False)
        assert runs["partition"].violations == 0 and runs["partition"].p99 <= qos
        return runs["partition"], runs["timeshare"]

    fills = S.SPAN_FILL
    before, _ = partition_run(tuple(f for f in fills if f != 0.25))
    after, ts = partition_run(fills)
    assert not before.fused_by_key  # half a fill and more: every slice too dear, time sharing
    assert after.fused_by_key and after.be_throughput > 1.02 * ts.be_throughput
