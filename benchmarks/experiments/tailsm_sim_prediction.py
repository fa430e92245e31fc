"""What SM-exclusive tail fill (``tailsm``) should buy Aker on BERT-base + hotspot: a replay on the simulated GPU.

    python benchmarks/experiments/tailsm_sim_prediction.py [--queries 150] [--sequences 2]

Session 10 measured the fused ``tail`` samples of every BERT-base GEMM shape with the two-programs-per-SM
LC tile (``predictor.json``, "bert-base (hotspot/stencil7 run, session 10)"). On the 48-tile shapes
(1024x768xK and the 8-row pooler) they are worse than session 9's samples, taken with the
one-program-per-SM tile: at x = 0.5, 1.19-1.21 T_lc against 1.05. Under that tile every LC block had its
SM to itself, because nothing else fit. That is what ``tailsm`` restores on purpose. The replay takes:

* ``tail``: session 10's samples on every shape;
* ``tailsm``: session 9's samples on the 48-tile shapes (a conservative stand-in: tailsm runs two BE
  programs on each free SM where session 9 ran one) and a near-serial law on the 144/192-tile shapes,
  where the BE work waits for the LC blocks (y = 1 + 0.95 x).

It prints Aker against time sharing with ``tail`` alone and with both versions (selection picks per
shape). It is a prediction, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # nothing here runs a kernel; keeps imports CPU-safe

import kfuse.colocate.scheduler as S  # noqa: E402
from kfuse.colocate.sim import H200_S9_HOTSPOT_TAIL, bert_replay  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "h200" / "predictor.json"
CASE = "bert-base (hotspot/stencil7 run, session 10)"
# session 10's profiled LC GEMM medians (logs/s10_colocate_bench_bert_hotspot_stencil7.log) and solo sum
GEMMS_S10 = {"1024x2304x768": 0.0163, "1024x768x768": 0.0109, "1024x3072x768": 0.0163, "1024x768x3072": 0.0286}
POOLER_S10 = ("8x768x768", 0.0103)
SOLO_S10 = 1.103
FEW_TILES = ("1024x768x768", "1024x768x3072", "8x768x768")  # 48 and 6 tiles of 128x128 for 132 SMs


def session10_tail_samples() -> dict[str, list[tuple[float, float]]]:
    rec = next(r for r in json.loads(RESULTS.read_text()) if r.get("case") == CASE)
    return {k.split("|")[0]: [tuple(p) for p in v["tail"]] for k, v in rec["samples"].items() if k.endswith("|hotspot")}


def gain(versions: list[str], samples: dict, queries: int, sequences: int) -> tuple[float, int, float, float]:
    sim = bert_replay(GEMMS_S10, POOLER_S10, SOLO_S10, samples)
    prof = S.build_profile(sim, ["hotspot"], versions, reps=2)
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    extra = S.extra_budget(prof, qos, rate)
    seqs = [S.poisson_arrivals(rate, queries, s) for s in range(sequences)]
    ts = S.merge_runs([S.run_policy(sim, prof, "timeshare", a, ["hotspot"], qos, extra_per_query_ms=extra) for a in seqs])
    ak = S.merge_runs([S.run_policy(sim, prof, "aker", a, ["hotspot"], qos, extra_per_query_ms=extra) for a in seqs])
    chosen = {k: sel.version for (k, _), sel in prof.chosen.items()}
    print(f"  versions {versions}: chosen {chosen}")
    return ak.be_throughput / ts.be_throughput - 1, ak.violations, ak.p99, qos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--sequences", type=int, default=2)
    a = ap.parse_args()
    tail = session10_tail_samples()
    tailsm = {k: (H200_S9_HOTSPOT_TAIL[k] if k in FEW_TILES else [(x, 1.0 + 0.95 * x) for x in (0.25, 0.5, 1.0, 2.0, 4.0)]) for k in tail}
    rows = [("tail (session 10 samples)", ["tail"], {"tail": tail})]
    rows.append(("tail + tailsm", ["tail", "tailsm"], {"tail": tail, "tailsm": tailsm}))
    print(f"{'versions':28s} {'Aker vs TS':>10s} {'violations':>10s} {'p99 / QoS ms':>14s}")
    for name, versions, samples in rows:
        g, v, p99, qos = gain(versions, samples, a.queries, a.sequences)
        print(f"{name:28s} {g:+10.1%} {v:10d} {p99:6.2f} / {qos:5.2f}")


if __name__ == "__main__":
    main()
