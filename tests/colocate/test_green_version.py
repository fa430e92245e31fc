"""The ``green<S>`` version (the LC kernel on one SM partition, the BE slice on the disjoint rest): named and parsed
like the other versions, refused by the one-launch fuser, the only version the profile measures for LC kernels
that are not PTB GEMMs, taken by Aker for those kernels where it overlaps, and run by the CUDA backend with both
results correct (in order on the CPU). On a GPU: the two partitions' SMs are disjoint and add up to the device."""

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from kfuse.colocate import green as G
from kfuse.colocate import ptb
from kfuse.colocate import scheduler as S
from kfuse.colocate.fuser import PRIO, TAIL, any_kernel, green, launch_args, parse_version
from kfuse.colocate.lc import segment_key
from kfuse.colocate.sim import SimGPU, bert_s9_partitioned, h200_like, partition_law

GPU = torch.cuda.is_available()


def test_green_is_a_named_version_the_fuser_does_not_launch(device: str) -> None:
    v = parse_version("green32")
    assert v == green(32) and v.describe() == "green32" and v.r2 == 32
    assert any_kernel(v) and not any_kernel(TAIL) and not any_kernel(PRIO) and not any_kernel((1, 2))
    with pytest.raises(ValueError, match="SM count"):
        parse_version("green")
    with pytest.raises(ValueError, match="at least one SM"):
        green(0)
    a, b = torch.randn(8, 16, device=device).half(), torch.randn(16, 8, device=device).half()
    gemm = ptb.gemm_kernel(a, b, torch.empty(8, 8, device=device).half())
    with pytest.raises(ValueError, match="SM partitions"):
        launch_args(gemm, (0, gemm.n_blocks), gemm, (0, gemm.n_blocks), v, sms=2)


def test_run_partitioned_without_a_partition_runs_both_in_order() -> None:
    order: list[str] = []
    G.run_partitioned(None, lambda: order.append("lc"), lambda: order.append("be"))
    assert order == ["lc", "be"]


@pytest.mark.skipif(GPU, reason="the error without a GPU")
def test_split_sms_without_a_gpu_says_why() -> None:
    with pytest.raises(G.GreenContextError, match="no CUDA device"):
        G.split_sms(16)


def test_segment_keys_follow_ops_and_shapes() -> None:
    x, y = torch.empty(4, 8), torch.empty(4, 16)
    k = segment_key(("layer_norm", "add"), [x, None])
    assert k.startswith("seg:layer_norm+add:")
    assert segment_key(("layer_norm", "add"), [torch.empty(4, 8), None]) == k  # a repeated layer shares its key
    assert segment_key(("layer_norm", "add"), [y, None]) != k
    assert segment_key(("layer_norm",), [x, None]) != k


def _sim_run(lc_slowdown: float, load: float = 0.8) -> tuple[dict[str, S.RunResult], S.Profile, float]:
    """ResNet-50-shaped LC kernels and sgemm (0.03 ms launch cost) on the simulated GPU: the fused version overlaps
    by -20%, the partition version gives the BE 32 of 132 SMs and costs the LC kernel ``lc_slowdown``."""
    v = green(32)
    sim = h200_like({(1, 2): -0.2, v: partition_law(32 / 132, lc_slowdown, 0.03)}, noise=0.0)
    prof = S.build_profile(sim, ["sgemm"], [(1, 2), v], reps=1)
    qos = 5 * prof.lc_total
    rate = load * S.max_lc_rate(prof, qos)
    arrivals = S.poisson_arrivals(rate, 300, 1)
    extra = S.extra_budget(prof, qos, rate)
    return {p: S.run_policy(sim, prof, p, arrivals, ["sgemm"], qos, extra_per_query_ms=extra) for p in ("timeshare", "aker")}, prof, qos


def test_profile_measures_segments_with_the_green_version_only() -> None:
    _, prof, _ = _sim_run(1.0)
    seg_pairs = [pair for pair in prof.samples if pair[0].startswith("seg")]
    gemm_pairs = [pair for pair in prof.samples if not pair[0].startswith("seg")]
    assert seg_pairs and gemm_pairs
    assert all(set(prof.samples[p]) == {green(32)} for p in seg_pairs)
    assert all(set(prof.samples[p]) == {(1, 2), green(32)} for p in gemm_pairs)
    # sampled around the BE partition's share of the SMs (32 / 132), where its slices are cheap, not at the fused
    # versions' load ratios (0.25 to 4; a segment's smallest slice is one block and the 0.03 ms launch cost)
    xs = [x for p in gemm_pairs for x, _ in prof.samples[p][green(32)]]
    assert min(xs) < 0.2 and max(xs) < 1.0


def test_aker_co_runs_segments_on_partitions_with_qos_kept() -> None:
    r, _, qos = _sim_run(1.0)
    ts, ak = r["timeshare"], r["aker"]
    by_key = ak.summary()["fused_by_key"]
    assert any(k.startswith("seg") and k.endswith("|green32") for k in by_key)  # the non-GEMM kernels co-ran too
    assert all(k.endswith("|green32") for k in by_key)  # the fused version without overlap was never taken
    assert ak.be_throughput >= 1.08 * ts.be_throughput  # 1.12 in this set-up (session 50)
    assert ak.violations == 0 and ak.p99 <= qos


def test_partitions_that_halve_the_lc_are_time_sharing() -> None:
    r, _, _ = _sim_run(2.0)
    assert r["aker"].fused_launches == 0
    assert r["aker"].be_throughput >= 0.99 * r["timeshare"].be_throughput


def test_green_through_the_backend_on_a_gemm_and_a_segment(gemm_lc_backend: Callable[[str], SimpleNamespace]) -> None:
    t = gemm_lc_backend("histogram")
    a, b, c, w, expect_be, backend = t.a, t.b, t.c, t.w, t.expect_be, t.backend
    ran: list[int] = []
    backend.segments[1] = lambda: ran.append(1)  # the segment: any LC kernel takes the green version
    n = w.kernel.n_blocks
    half = max(1, n // 2)
    sms = max(1, backend.sms // 4)
    backend.run_fused(0, "histogram", 0, half, green(sms))
    backend.run_fused(1, "histogram", half, n, green(sms)) if half < n else backend.run_fused(1, "histogram", 0, 0, green(sms))
    assert ran == [1]
    assert torch.allclose(c.cpu().float(), a.cpu().float() @ b.cpu().float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(w.output(), expect_be)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a GPU")
def test_partitions_are_disjoint_and_cover_the_device() -> None:
    total = torch.cuda.get_device_properties(0).multi_processor_count
    part = G.split_sms(32)
    assert part.lc_sms + part.be_sms == total and part.be_sms >= 32
    lc, be = G.sm_ids(part.lc_stream), G.sm_ids(part.be_stream)
    assert len(lc) == part.lc_sms and len(be) == part.be_sms
    assert not lc & be
    # the backfill stream is the LC's SMs at the lowest priority
    assert part.lc_fill_stream is not None and G.sm_ids(part.lc_fill_stream) == lc
    assert part.lc_fill_stream.priority > part.lc_stream.priority  # a larger number is less urgent


def test_cli_takes_green_versions(colocate_cli) -> None:  # noqa: ANN001
    """``kfuse colocate run --versions green32,1:2`` reaches the profile; a bad version is refused with the reason."""
    r, seen, recs = colocate_cli("green32,1:2")
    assert r.exit_code == 0, r.output
    assert seen["versions"] == (green(32), parse_version("1:2"))
    assert recs and all(rec["command"].endswith("--versions green32,1:2") for rec in recs)
    bad, _, _ = colocate_cli("green")
    assert bad.exit_code != 0 and "SM count" in bad.output


def _bert_like(be_sms: int, slowdown: float) -> SimGPU:
    """BERT-base B8 S128 with sgemm (``sim.bert_s9_partitioned``); the whole query on the SMs a ``be_sms`` partition
    leaves takes ``slowdown`` x its time."""
    return bert_s9_partitioned(partition_law(be_sms / 132, 1.0, 0.0047), 0.03, {be_sms: slowdown})


def _partition_run(be_sms: int, slowdown: float) -> tuple[dict[str, S.RunResult], S.Profile, float]:
    sim = _bert_like(be_sms, slowdown)
    prof = S.build_profile(sim, ["sgemm"], [green(be_sms)], reps=1, span_sms=[be_sms])
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    arrivals = S.poisson_arrivals(rate, 300, 1)
    extra = S.extra_budget(prof, qos, rate)
    runs = {p: S.run_policy(sim, prof, p, arrivals, ["sgemm"], qos, extra_per_query_ms=extra) for p in ("timeshare", "partition")}
    return runs, prof, qos


def test_partition_policy_runs_be_beside_whole_queries_with_qos_kept() -> None:
    r, prof, qos = _partition_run(48, 1.0)
    ts, pa = r["timeshare"], r["partition"]
    assert prof.span_solo_ms > 0 and prof.spans[("sgemm", 48)][0][0] == 0  # the query alone, then slices
    assert max(n for n, _ in prof.spans[("sgemm", 48)]) > prof.be_blocks["sgemm"]  # slices run on into next instances
    assert pa.decisions.get("span", 0) > 0.9 * len(pa.latencies_ms)
    assert pa.be_throughput >= 1.25 * ts.be_throughput  # +32% in this set-up (session 50)
    assert pa.violations == 0 and pa.p99 <= qos
    assert pa.be_units == pytest.approx(ts.be_units * pa.be_throughput / ts.be_throughput, rel=0.05)


def test_partition_that_slows_the_query_past_its_allowance_is_time_sharing() -> None:
    r, _, _ = _partition_run(48, 1.3)
    assert r["partition"].decisions.get("span", 0) == 0
    assert r["partition"].be_throughput == pytest.approx(r["timeshare"].be_throughput, rel=0.02)


def test_span_plan_cuts_slices_to_the_head_kernel_when_other_jobs_wait() -> None:
    _, prof, _ = _partition_run(48, 1.0)
    on = S.span_plan(prof, "sgemm", 5000, 1.0, run_on=True)
    cut = S.span_plan(prof, "sgemm", 5000, 1.0, run_on=False)
    assert on is not None and on.blocks > 5000 and cut is not None and cut.blocks == 5000
    assert S.span_plan(prof, "sgemm", 5000, 0.0) is None  # no headroom: no span
    assert S.span_plan(prof, "sgemm", 100, 1.0, run_on=False) is None  # 1.6 us of BE work does not pay the 2% margin


def test_run_span_runs_the_query_and_the_slice_into_the_next_instance(gemm_lc_backend: Callable[[str], SimpleNamespace]) -> None:
    t = gemm_lc_backend("histogram")
    a, b, c, w, expect_be, backend = t.a, t.b, t.c, t.w, t.expect_be, t.backend
    runs = torch.zeros(1, device=a.device)
    backend.items[1].run = lambda: runs.add_(1)  # the segment, as the query's graph runs it (from its steps)
    n = w.kernel.n_blocks
    sms = max(1, backend.sms // 4)
    backend.run_span("histogram", 0, n, 0)  # the query alone: no BE work (the histogram stays zeroed)
    assert int(torch.count_nonzero(w.output())) == 0
    before = float(runs)
    backend.run_span("histogram", 0, n, sms)  # the query beside one whole kernel's blocks
    # the segment ran in each span (on a GPU the query is one CUDA graph: its capture's warm-up runs it too)
    assert before >= 1 and float(runs) >= before + 1
    assert torch.allclose(c.cpu().float(), a.cpu().float() @ b.cpu().float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(w.output(), expect_be)
    w.reset()
    backend.run_span("histogram", n // 2, n // 2 + 2 * n, sms)  # the rest of one instance, a whole one, half of a third
    assert torch.equal(w.output(), 2 * expect_be)  # every block counted exactly twice over the three launches


def test_partition_runs_on_spans_alone_without_per_kernel_profiles() -> None:
    """``--max-keys 0`` profiles the whole-query spans and no per-kernel version: the partition policy runs as before
    (the GPU time of a partition-only benchmark goes to the spans and the runs)."""
    sim = _bert_like(48, 1.0)
    prof = S.build_profile(sim, ["sgemm"], [green(48)], reps=1, span_sms=[48], max_fuse_keys=0)
    assert not prof.fused and not prof.chosen and ("sgemm", 48) in prof.spans
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    arrivals = S.poisson_arrivals(rate, 200, 1)
    extra = S.extra_budget(prof, qos, rate)
    ts, pa = (S.run_policy(sim, prof, p, arrivals, ["sgemm"], qos, extra_per_query_ms=extra) for p in ("timeshare", "partition"))
    assert pa.decisions.get("span", 0) > 0.9 * len(pa.latencies_ms) and pa.be_throughput > 1.2 * ts.be_throughput
