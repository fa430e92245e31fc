"""Issue 5 on the GPU: does the same plan run slower after the GPU has been busy for a while?

Sessions 15-16 timed the same unfused pair at M = 1M, 256 -> 256 -> 256 (two identical GEMM
kernels) at 0.61-0.62 ms during the compile (the decision and the plan re-check) and at 0.65-0.70 ms
a few seconds later in the bench (`decision_vs_plan_probe`: no way of calling it explains the gap;
every way agreed within 1% within a run). The hypothesis left: the GPU's state. The decision runs
after seconds of host-side tuning (an idle GPU), the bench after seconds of back-to-back 0.7 ms
kernels (a hot one, maybe power-capped).

This probe compiles that chain once (pair side), then alternates: idle ``--idle-s`` seconds, time
the plan (20 calls a graph, the bench's timing); run it back to back for ``--hot-s`` seconds, time
it again. Each timing is paired with nvidia-smi's SM clock, power draw and temperature.

    PYTHONPATH=. python benchmarks/experiments/clock_drift_probe.py --out $OUT/r   # H200, ~60 s
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import torch
from torch import nn

import kfuse
from kfuse.bench.harness import graph_ms_per_call, write_experiment

QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def gpu_state() -> dict[str, str]:
    """nvidia-smi's view now (empty where it is missing)."""
    try:
        cmd = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    vals = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")] if out.stdout.strip() else []
    return dict(zip(QUERY.split(","), vals, strict=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", type=int, default=1 << 20)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=4.0)
    ap.add_argument("--hot-s", type=float, default=8.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("clock_drift_probe needs a GPU")
    w = a.width
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w)).cuda().half().eval()
    x = torch.randn(a.m, w, device="cuda", dtype=torch.float16)
    c = kfuse.compile(model, (x,), tune="fast", fuse_b2b=False, cuda_graphs=False)  # the timing captures its own graph
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def timed(phase: str) -> None:
        before = gpu_state()
        ms, _ = graph_ms_per_call(c, (x,), calls=20)
        rows.append({"t_s": round(time.perf_counter() - t0, 2), "phase": phase, "ms": ms, "before": before, "after": gpu_state()})
        b = before.get
        print(f"{rows[-1]['t_s']:7.1f} s {phase:5s} {ms:.4f} ms  sm {b('clocks.sm', '?')} MHz  {b('power.draw', '?')} W  "
              f"{b('temperature.gpu', '?')} C  throttle {b('clocks_throttle_reasons.active', '?')}", flush=True)  # fmt: skip

    for _ in range(a.rounds):
        torch.cuda.synchronize()
        time.sleep(a.idle_s)
        timed("idle")
        end = time.perf_counter() + a.hot_s
        while time.perf_counter() < end:
            for _ in range(20):
                c(x)
            torch.cuda.synchronize()
        timed("hot")
    idle = sorted(r["ms"] for r in rows if r["phase"] == "idle")
    hot = sorted(r["ms"] for r in rows if r["phase"] == "hot")
    summary = {"idle_median_ms": idle[len(idle) // 2], "hot_median_ms": hot[len(hot) // 2]}
    write_experiment("clock_drift_probe", a.out, case=f"M{a.m}_{w}x{w}x{w}", **summary, rows=rows)
    print(f"idle median {summary['idle_median_ms']:.4f} ms, hot median {summary['hot_median_ms']:.4f} ms")


if __name__ == "__main__":
    main()
