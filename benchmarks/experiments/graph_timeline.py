"""Where a compiled model's CUDA-graph replay spends its time: kernels vs the gaps between them.

Session 7: ResNet-50 B1 replays 45 kernels in 0.539 ms per call while the step profile (each
step alone) sums to 0.045 ms. This compiles a model (tune fast), replays it under
``torch.profiler`` (CUPTI sees the kernels inside graphs) and prints the span of one call, the
summed kernel time, the gaps, and the largest kernels and gaps with their neighbours, plus the
host time of one call (``compiled(*args)`` without a sync). Raw per-kernel rows go to JSON.

    PYTHONPATH=. python benchmarks/experiments/graph_timeline.py --out $OUT --model resnet50 --batch 1   # H200, ~70 s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

import kfuse
import kfuse.models as zoo


def _kernel_events(prof: Any) -> list[dict[str, Any]]:
    rows = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() >= 0:
            rows.append({"name": e.name, "start_us": e.time_range.start, "end_us": e.time_range.end})
    return sorted(rows, key=lambda r: r["start_us"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    m, a, kw = zoo.build(args.model, batch=args.batch, seq=args.seq, dtype=torch.float16, device="cuda")
    cl = args.model.startswith("resnet")
    if cl:
        m = m.to(memory_format=torch.channels_last)
        a = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in a)
    with torch.no_grad():
        compiled = kfuse.compile(m, a, kw, tune="fast")
        for _ in range(20):
            compiled(*a, **kw)
        torch.cuda.synchronize()
        host = []
        for _ in range(50):  # host time of one call: what the GPU may wait for
            t0 = time.perf_counter()
            compiled(*a, **kw)
            host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(args.calls):
                compiled(*a, **kw)
                torch.cuda.synchronize()  # calls apart: one call's span is clear
    ks = _kernel_events(prof)
    # split into calls at gaps > 20 us (the syncs between calls; inside a graph they are < 2 us)
    calls: list[list[dict[str, Any]]] = [[]]
    for r in ks:
        if calls[-1] and r["start_us"] - calls[-1][-1]["end_us"] > 20:
            calls.append([])
        calls[-1].append(r)
    last = calls[-1]
    span = last[-1]["end_us"] - last[0]["start_us"]
    busy = sum(r["end_us"] - r["start_us"] for r in last)
    gaps = [(last[i + 1]["start_us"] - last[i]["end_us"], last[i]["name"], last[i + 1]["name"]) for i in range(len(last) - 1)]
    print(f"{args.model} B{args.batch}: {len(calls)} calls seen, {len(last)} kernels in the last one")
    print(f"  span {span / 1e3:.4f} ms, kernels {busy / 1e3:.4f} ms, gaps {(span - busy) / 1e3:.4f} ms")
    print(f"  host time of one call {statistics.median(host):.4f} ms")
    print("  largest kernels:")
    for r in sorted(last, key=lambda r: r["start_us"] - r["end_us"])[:10]:
        print(f"    {(r['end_us'] - r['start_us']):8.2f} us  {r['name'][:90]}")
    print("  largest gaps:")
    for g, before, after in sorted(gaps, reverse=True)[:10]:
        print(f"    {g:8.2f} us  {before[:45]} -> {after[:45]}")
    os.makedirs(args.out, exist_ok=True)
    rec = {"model": args.model, "batch": args.batch, "span_ms": span / 1e3, "kernels_ms": busy / 1e3,
           "host_call_ms": statistics.median(host), "kernels": last, "report_cuda_graph": compiled.report.get("cuda_graph")}  # fmt: skip
    with open(os.path.join(args.out, f"graph_timeline_{args.model}_B{args.batch}.json"), "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
