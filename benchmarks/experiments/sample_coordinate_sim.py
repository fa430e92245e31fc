"""What session 13's co-location runs would have gained with the profile's samples in the run's coordinate.

    python benchmarks/experiments/sample_coordinate_sim.py [--queries 150] [--sequences 2]

Session 13's H200 runs (``predictor.json``, the three session-13 BERT-base records) planned each fused slice in
a different coordinate from the one its profile sampled in, twice over:

* The profile's x was the slice's *measured* solo time over T_lc. BE blocks run in waves of the PTB grid, so
  1 and 151 lbm blocks both measured x = 1.0, while the run turned x = 1.0 into 488 blocks through the BE
  kernel's linear fit (``split_be``). The profile now records the fit's time for the blocks it sampled.
* The run scaled every LC time by the solo calibration (x1.29) after the samples were normalised by the
  unscaled times, so a slice aimed at x cut 1.29x the blocks the sample at x had measured. ``Profile.rescale_lc``
  now moves the samples with the LC times.

This replays each BE kernel's measured samples at the block counts the profile actually launched (the fit
ratios and held-out ratios in order, turned into blocks as ``build_profile`` does), so the simulated GPU runs
each fused slice at the T_fused / T_lc measured for that block count; Aker plans with a profile of it, priced.
It is a prediction of the fixed code, next to what the H200 measured with the old one.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # nothing here runs a kernel; keeps imports CPU-safe

import kfuse.colocate.scheduler as S  # noqa: E402
from kfuse.colocate.predictor import LinearModel  # noqa: E402
from kfuse.colocate.sim import bert_replay  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "h200"
POOLER = "8x768x768"
RUNS = {  # predictor.json case -> each profiled LC GEMM's median (ms, unscaled) and the sum of kernel medians (the run's log)
    "bert-base (histogram/stencil7 run, session 13)": (
        {"1024x2304x768": 0.0161, "1024x768x768": 0.0106, "1024x3072x768": 0.0161, "1024x768x3072": 0.0280, POOLER: 0.0101}, 1.086),
    "bert-base (hotspot/mriq/sgemm run, session 13)": (
        {"1024x2304x768": 0.0162, "1024x768x768": 0.0108, "1024x3072x768": 0.0163, "1024x768x3072": 0.0286, POOLER: 0.0100}, 1.092),
    "bert-base (lbm/cutcp/pathfinder run, session 13)": (
        {"1024x2304x768": 0.0162, "1024x768x768": 0.0108, "1024x3072x768": 0.0163, "1024x768x3072": 0.0285, POOLER: 0.0101}, 1.094),
}  # fmt: skip


def in_run_coordinate(pts: list[list[float]], t_lc: float, a: float, b: float, blocks: int) -> list[tuple[float, float]]:
    """Each sample at the x of the blocks it launched: n = blocks_for(ratio T_lc), x = (a + b n) / T_lc."""
    be = LinearModel(a, b)
    ns = [min(blocks, max(1, int(be.blocks_for(r * t_lc)))) for r in (*S.FIT_RATIOS, *S.HELDOUT_RATIOS)]
    return [(be.predict(n) / t_lc, y) for n, (_, y) in zip(ns, pts, strict=False)]


def measured(be: str) -> float:
    rec = next(r for r in json.loads((RESULTS / "colocate.json").read_text()) if r["case"] == f"bert-base+{be}" and r["policy"] == "aker")
    return float(rec["be_gain_vs_timesharing"])


def replay(case: str, be: str, rec: dict, queries: int, sequences: int) -> tuple[float, int, dict[str, float]]:
    times, solo = RUNS[case]
    fit = rec["be_fit"][be]
    a, b, nb = fit["a_ms"], fit["b_ms_per_block"], fit["blocks"]
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for pair, per_v in rec["samples"].items():
        shape, name = pair.split("|")
        if name == be:
            for v, pts in per_v.items():
                samples.setdefault(v, {})[shape] = in_run_coordinate(pts, times[shape], a, b, nb)
    gemms = {k: t for k, t in times.items() if k != POOLER}
    sim = bert_replay(gemms, (POOLER, times[POOLER]), solo, samples, be=(be, (a, b, nb)))
    prof = S.build_profile(sim, [be], sorted(samples), reps=2)
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    extra = S.extra_budget(prof, qos, rate)
    seqs = [S.poisson_arrivals(rate, queries, s) for s in range(sequences)]
    ts = S.merge_runs([S.run_policy(sim, prof, "timeshare", q, [be], qos, extra_per_query_ms=extra) for q in seqs])
    e = prof.price_aims(be, extra)
    ak = S.merge_runs([S.run_policy(sim, prof, "aker", q, [be], qos, extra_per_query_ms=extra) for q in seqs])
    aims = {f"{k} {sel.version}": round(sel.opportune_ratio, 2) for (k, _), sel in prof.chosen.items()}
    return ak.be_throughput / ts.be_throughput - 1.0, ak.violations, {"E": e, **aims}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--sequences", type=int, default=2)
    a = ap.parse_args()
    recs = {r["case"]: r for r in json.loads((RESULTS / "predictor.json").read_text()) if r.get("kind") == "predictor"}
    gains = []
    for case in RUNS:
        for be in recs[case]["be_fit"]:
            g, v, aims = replay(case, be, recs[case], a.queries, a.sequences)
            gains.append(g)
            print(f"{be:10s} simulated {g:+7.1%} (violations {v})  H200 session 13 {measured(be):+7.1%}  aims {aims}")
    print(f"mean simulated {sum(gains) / len(gains):+.1%}")


if __name__ == "__main__":
    main()
