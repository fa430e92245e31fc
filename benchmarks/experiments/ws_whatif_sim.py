"""What Aker's scheduler would make of the worker-partition curves (issue 8), replayed on the simulated GPU.

    python benchmarks/experiments/ws_whatif_sim.py [--probe benchmarks/results/h100/ws_colocate_probe_s56_run2.json]
    python benchmarks/experiments/ws_whatif_sim.py --profile benchmarks/results/h200/colocate_s65_predictor_run2.json \
        --solo-ms 0.735

Session 56 measured, on an H100, BERT-base B8 S128's four GEMM shapes as ping-pong kernels whose worker partition runs
a BE slice (``ws_colocate_probe.py``): per shape and BE kernel, points (x = slice's solo time / T_lc, y = fused time /
T_lc) against the faster of the best solo kernel and the host with an idle partition. This replays them through the
real profile, selector and scheduler (``kfuse.colocate.sim.bert_replay``: the four GEMMs x 12 layers at those solo
times, the rest of the tuned compiled query, 0.731 ms of kernels on the H100, as equal segments; QoS 5x solo, load
0.8, priced aims) and prints Aker's BE throughput against time sharing per BE kernel. The pooler GEMM (M = 8) takes
the attention-output curve. A prediction for ``benchmarks/calls/s56_call3.sh``, not a measurement: the profile's
curves are the probe's medians, the BE kernels' linear fits come from the probe's solo slices, and the simulator has
no launch gaps or CUDA-graph effects.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # nothing here runs a kernel; keeps imports CPU-safe

import numpy as np  # noqa: E402

import kfuse.colocate.scheduler as S  # noqa: E402
from kfuse.colocate.sim import bert_replay  # noqa: E402

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("ws_colocate_probe", _HERE / "ws_colocate_probe.py")
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)

KEYS = {"qkv": "1024x2304x768", "attn_out": "1024x768x768", "ffn1": "1024x3072x768", "ffn2": "1024x768x3072"}
BE_BLOCKS = {"histogram": 32768, "mriq": 32768, "stencil7": 32768, "cutcp": 49152}  # the GPU workloads' blocks (probe log)


X_GRID = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def _aker_vs_timeshare(
    gemms: dict[str, float], curves: dict, spec: tuple, solo_ms: float, queries: int, sequences: int, bias: float,
    key_chars: int | None = None,
) -> tuple[float, int, dict]:  # fmt: skip
    """Aker's BE throughput over time sharing on the simulated BERT-base (``bert_replay``) with fused ``curves`` per
    GEMM key (the run's launches ``bias`` x the profiled time), QoS 5x solo, load 0.8, priced aims; its violations and
    aims (keys cut to ``key_chars``)."""
    be = spec[0]
    pooler = ("8x768x768", 0.005)
    prof = S.build_profile(bert_replay(gemms, pooler, solo_ms, {"ws": curves}, be=spec), [be], ["ws"], reps=2)
    biased = {k: [(x, y * bias) for x, y in pts] for k, pts in curves.items()}
    sim = bert_replay(gemms, pooler, solo_ms, {"ws": biased}, be=spec)
    qos = 5 * prof.lc_total
    rate = 0.8 * S.max_lc_rate(prof, qos)
    extra = S.extra_budget(prof, qos, rate)
    prof.price_aims(be, extra)
    seqs = [S.poisson_arrivals(rate, queries, s) for s in range(sequences)]
    ts = S.merge_runs([S.run_policy(sim, prof, "timeshare", arr, [be], qos, extra_per_query_ms=extra) for arr in seqs])
    ak = S.merge_runs([S.run_policy(sim, prof, "aker", arr, [be], qos, extra_per_query_ms=extra) for arr in seqs])
    aims = {k[:key_chars]: round(sel.opportune_ratio, 2) for (k, _), sel in prof.chosen.items()}
    return ak.be_throughput / ts.be_throughput - 1, ak.violations, aims


def replay(records: list[dict], be: str, solo_ms: float, queries: int, sequences: int, bias: float,
           no_host_cost: bool = False, slope: float | None = None) -> tuple[float, int, dict]:  # fmt: skip
    """Aker against time sharing on the simulated GPU with ``be``'s measured curves (``no_host_cost``: each curve
    shifted down by its host's idle-partition excess, y(0) - 1: what a host with no fixed cost would give; ``slope``:
    every curve replaced by the line y = 1 + slope x, session 15's study on the compiled LC's GEMMs)."""
    rows = [r for r in probe.summarize(records) if r["be"] == be]
    gemms = {KEYS[s]: next(r["lc_ref_ms"] for r in rows if r["shape"] == s) for s in KEYS}
    idle = {s: next((r["y"] - 1 for r in rows if r["shape"] == s and r["S"] == 0), 0.0) if no_host_cost else 0.0 for s in KEYS}
    curves = {KEYS[s]: sorted((r["x"], max(1.0, r["y"] - idle[s])) for r in rows if r["shape"] == s and r["S"] > 0) for s in KEYS}
    if slope is not None:
        curves = {k: [(x, 1.0 + slope * x) for x in X_GRID] for k in curves}
    curves["8x768x768"] = curves[KEYS["attn_out"]]
    solo = [(r["blocks"], r["be_solo_ms"]) for r in records if r["be"] == be and r["blocks"] > 0]
    b, a = np.polyfit([n for n, _ in solo], [t for _, t in solo], 1)
    spec = (be, (max(float(a), 0.0), float(b), BE_BLOCKS[be]))
    return _aker_vs_timeshare(gemms, curves, spec, solo_ms, queries, sequences, bias)


def replay_profile(pred: dict, be: str, solo_ms: float, queries: int, sequences: int, bias: float) -> tuple[float, int, dict]:
    """As ``replay``, from a real run's own profile (``colocate_bench.py``'s ``predictor.json`` record for ``be``): its
    fused samples per GEMM key, each key's solo time from its fusion plan, the BE kernel's linear fit. The keys are
    ordered by solo time onto the four GEMMs of a layer (the sim needs only their times and curves); the pooler takes
    the smallest key's curve."""
    fit = pred["be_fit"][be]
    plans = pred["plans"][be]
    pairs = {k.split("|")[0]: v["ws"] for k, v in pred["samples"].items() if k.endswith(f"|{be}") and "ws" in v}
    gemms = {k: plans[k]["t_lc_ms"] for k in pairs if "t_lc_ms" in plans.get(k, {})}
    if len(gemms) != 4:
        raise SystemExit(f"{be}: {len(gemms)} GEMM keys with a solo time in the profile, need 4")
    curves = {k: sorted((float(x), float(y)) for x, y in pairs[k]) for k in gemms}
    small = min(gemms, key=gemms.get)
    curves["8x768x768"] = curves[small]
    spec = (be, (float(fit["a_ms"]), float(fit["b_ms_per_block"]), int(fit["blocks"])))
    return _aker_vs_timeshare(gemms, curves, spec, solo_ms, queries, sequences, bias, key_chars=20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", default=str(_HERE.parent / "results" / "h100" / "ws_colocate_probe_s56_run2.json"))
    ap.add_argument("--solo-ms", type=float, default=0.731, help="the LC query's kernels (the tuned compiled BERT-base, H100)")
    ap.add_argument("--queries", type=int, default=150)
    ap.add_argument("--sequences", type=int, default=2)
    ap.add_argument("--bias", default="1.0,1.1", help="the runs' fused launches take these x the profiled time")
    ap.add_argument("--no-host-cost", action="store_true", help="also replay each curve without its host's fixed cost")
    ap.add_argument("--slopes", default="", help="instead: every curve the line y = 1 + s x, for each s (comma-separated)")
    ap.add_argument("--profile", default="", help="instead: a co-location run's predictor.json (its own fused samples)")
    a = ap.parse_args()
    if a.profile:
        for pred in (r for r in json.loads(Path(a.profile).read_text()) if r.get("kind") == "predictor"):
            for be in pred["be_fit"]:
                for bias in (float(x) for x in a.bias.split(",")):
                    gain, viol, aims = replay_profile(pred, be, a.solo_ms, a.queries, a.sequences, bias)
                    print(f"  {Path(a.profile).name} bias {bias:.2f} {be:9s} {gain:+7.1%}  violations {viol}  aims {aims}")
        return
    rec = json.loads(Path(a.probe).read_text())
    bes = sorted({r["be"] for r in rec["records"]})
    print(f"{rec['gpu']}, {Path(a.probe).name}: Aker (ws) against time sharing, simulated")
    if a.slopes:
        for slope in (float(x) for x in a.slopes.split(",")):
            for be in bes:
                gain, viol, _ = replay(rec["records"], be, a.solo_ms, a.queries, a.sequences, 1.0, slope=slope)
                print(f"  line y = 1 + {slope:g} x  {be:9s} {gain:+7.1%}  violations {viol}")
        return
    for free in (False, True) if a.no_host_cost else (False,):
        for bias in (float(x) for x in a.bias.split(",")):
            for be in bes:
                gain, viol, aims = replay(rec["records"], be, a.solo_ms, a.queries, a.sequences, bias, free)
                label = " no host cost" if free else ""
                print(f"  bias {bias:.2f}{label} {be:9s} {gain:+7.1%}  violations {viol}  aims {aims}")


if __name__ == "__main__":
    main()
