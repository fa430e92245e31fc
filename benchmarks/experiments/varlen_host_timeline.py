"""Host/GPU timeline of one padding-free BERT call (H200 diagnostic for issue 4).

    PYTHONPATH=. python benchmarks/experiments/varlen_host_timeline.py --out DIR [--batch 32 --seq 128]

A padding-free call reads the token count on the host (one sync) before it can pick the
bucket's CUDA graph, so whatever the host does around that sync is time the GPU sits idle.
This compiles bert-base with an attention mask, profiles a few calls with ``torch.profiler``
(CPU ops and CUDA kernels), and for one call prints every host op with its start and length
relative to the call, the GPU's busy and idle time inside the call, and the host time from the
call's start to the bucket graph's launch. Writes ``DIR/varlen_host_timeline.json`` (and the
Chrome trace) and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import kfuse
import kfuse.models
from kfuse.bench.harness import time_ms


def _intervals(events: list, kind: str) -> list[tuple[float, float, str]]:
    out = []
    for e in events:
        dev = getattr(e, "device_type", None)
        is_gpu = dev is not None and "CUDA" in str(dev)
        if (kind == "gpu") != is_gpu:
            continue
        tr = e.time_range
        out.append((float(tr.start), float(tr.end), e.name))
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--calls", type=int, default=6)
    a = ap.parse_args()
    m, args, kwargs = kfuse.models.build(
        "bert-base", batch=a.batch, seq=a.seq, dtype=torch.float16, device="cuda", with_mask=True, avg_len_ratio=0.6
    )
    compiled = kfuse.compile(m, args, kwargs, tune="fast")
    rec: dict = {"case": f"B{a.batch}_S{a.seq}_avg0.6", "cuda_graph": compiled.report["cuda_graph"]}
    with torch.no_grad():
        rec["call_ms"] = time_ms(lambda: compiled(*args, **kwargs), warmup=3, rep=30)
        for _ in range(3):
            compiled(*args, **kwargs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False) as prof:
            for i in range(a.calls):
                with record_function(f"call_{i}"):
                    compiled(*args, **kwargs)
                torch.cuda.synchronize()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / "varlen_host_timeline_trace.json"))
    events = list(prof.events())
    calls = sorted((e for e in events if e.name.startswith("call_")), key=lambda e: e.time_range.start)
    call = calls[len(calls) // 2]
    c0, c1 = float(call.time_range.start), float(call.time_range.end)
    host = [(s, e, n) for s, e, n in _intervals(events, "cpu") if c0 <= s <= c1 and not n.startswith("call_")]
    gpu = [(s, e, n) for s, e, n in _intervals(events, "gpu") if c0 <= s <= c1 + 5000]
    # top-level host ops only (not nested in another op of the list)
    top: list[tuple[float, float, str]] = []
    for s, e, n in host:
        if top and s < top[-1][1]:
            continue
        top.append((s, e, n))
    rec["host_ops"] = [{"op": n, "start_us": round(s - c0, 1), "us": round(e - s, 1)} for s, e, n in top]
    busy, last_end = 0.0, None
    idle = []
    for s, e, _ in gpu:
        if last_end is not None and s > last_end:
            idle.append((last_end - c0, s - last_end))
        busy += max(0.0, e - max(s, last_end or s))
        last_end = max(last_end or e, e)
    rec["call_us"] = round(c1 - c0, 1)
    rec["gpu_busy_us"] = round(busy, 1)
    rec["gpu_first_kernel_us"] = round(gpu[0][0] - c0, 1) if gpu else None
    rec["gpu_idle_gaps_over_5us"] = [{"at_us": round(at, 1), "us": round(d, 1)} for at, d in idle if d > 5]
    launches = [s for s, _, n in host if "GraphLaunch" in n]
    rec["graph_launches_at_us"] = [round(s - c0, 1) for s in launches]
    rec["kernels_in_call"] = len(gpu)
    (out / "varlen_host_timeline.json").write_text(json.dumps(rec, indent=1))
    for op in rec["host_ops"]:
        print(f"  host {op['start_us']:>8.1f} us  +{op['us']:>7.1f}  {op['op']}")
    for g in rec["gpu_idle_gaps_over_5us"]:
        print(f"  gpu idle at {g['at_us']:.1f} us for {g['us']:.1f} us")
    print(
        f"case {rec['case']}: call {rec['call_ms']:.3f} ms (events); profiled call {rec['call_us']:.0f} us, GPU busy "
        f"{rec['gpu_busy_us']:.0f} us, first kernel at {rec['gpu_first_kernel_us']} us, graph launches at {rec['graph_launches_at_us']}"
    )


if __name__ == "__main__":
    main()
