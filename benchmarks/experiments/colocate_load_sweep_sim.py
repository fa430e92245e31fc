"""Aker against time sharing across LC load and QoS target, on the simulated H200 (CPU, seconds).

    python benchmarks/experiments/colocate_load_sweep_sim.py [--queries 300]

The per-query allowance (how much a query may be lengthened by fusions and still keep p99
within QoS) is what limits Aker. It depends on the LC load and on the QoS target. This replays
``kfuse.colocate.sim.h200_round2`` (session 3's measured LC times, BE wave quantisation and best
overlaps, 10% noise) over a small grid and prints, per BE kernel: the allowance, BE throughput
under time sharing and under Aker, violations, fused launches and the gain. It predicts which GPU
run to do; it is not a measurement.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # nothing here runs a kernel; keeps imports CPU-safe

import kfuse.colocate.scheduler as S  # noqa: E402
from kfuse.colocate.sim import h200_round2  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--loads", default="0.3,0.5,0.8")
    ap.add_argument("--qos-factors", default="5,10")
    ap.add_argument("--be", default="sgemm,lbm")
    a = ap.parse_args()
    print(f"{'BE':6s} {'QoS':>5s} {'load':>5s} {'allow ms':>9s} {'TS BE/s':>8s} {'Aker BE/s':>9s} {'viol':>5s} {'fused':>6s} {'gain':>7s}")
    for be in a.be.split(","):
        sim = h200_round2(be, noise=0.1)
        prof = S.build_profile(sim, [be], ["tail", "1:1", "1:2"], reps=2)
        for qf in (float(x) for x in a.qos_factors.split(",")):
            qos = qf * prof.lc_total
            max_rate = S.max_lc_rate(prof, qos)
            for load in (float(x) for x in a.loads.split(",")):
                rate = load * max_rate
                arrivals = S.poisson_arrivals(rate, a.queries, 1)
                extra = S.extra_budget(prof, qos, rate)
                ts = S.run_policy(sim, prof, "timeshare", arrivals, [be], qos, extra_per_query_ms=extra)
                ak = S.run_policy(sim, prof, "aker", arrivals, [be], qos, extra_per_query_ms=extra)
                gain = ak.be_throughput / ts.be_throughput - 1 if ts.be_throughput else float("nan")
                print(
                    f"{be:6s} {qf:4.0f}x {load:5.2f} {extra:9.3f} {ts.be_throughput:8.0f} {ak.be_throughput:9.0f} "
                    f"{ak.violations:5d} {ak.fused_launches:6d} {gain:+7.1%}"
                )


if __name__ == "__main__":
    main()
