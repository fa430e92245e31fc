"""Where the time of a padding-free BERT call goes (H200 diagnostic for issue 4).

    PYTHONPATH=. python benchmarks/experiments/varlen_breakdown.py --out DIR [--batch 32 --seq 128]

Times, for one compiled bert-base with an attention mask (average length 0.6 x S): the whole
call; the varlen region step alone; its parts (token index with the host sync, the packed
plan's bucket graph replay); and a per-step profile of the packed plan (each step replayed alone).
Writes ``DIR/varlen_breakdown.json`` and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import kfuse
import kfuse.models
from kfuse.bench.harness import time_ms
from kfuse.runtime.profile import profile_plan, profile_summary
from kfuse.runtime.varlen import device_token_index, pack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rep", type=int, default=30)
    a = ap.parse_args()
    t0 = time.perf_counter()
    m, args, kwargs = kfuse.models.build(
        "bert-base", batch=a.batch, seq=a.seq, dtype=torch.float16, device="cuda", with_mask=True, avg_len_ratio=0.6
    )
    compiled = kfuse.compile(m, args, kwargs, tune="fast")
    v = list(compiled.variants.values())[-1]
    rec: dict = {"case": f"B{a.batch}_S{a.seq}_avg0.6", "cuda_graph": compiled.report["cuda_graph"], "compile_s": time.perf_counter() - t0}
    with torch.no_grad():
        rec["call_ms"] = time_ms(lambda: compiled(*args, **kwargs), warmup=3, rep=a.rep)
        runner = v.runner
        if runner is not None:
            xs = list(runner.static_inputs)
            rec["runner_ms"] = time_ms(lambda: runner(xs, clone_outputs=False), warmup=3, rep=a.rep)
        k = next(i for i, s in enumerate(v.plan.steps) if s.info.template == "varlen_region")
        step = v.plan.steps[k]
        state = step.fn.region_state
        seg = next(s for s in runner.segments if s.sync) if runner is not None and hasattr(runner, "segments") else None
        if seg is not None:
            sx = list(seg.sync_inputs)
            rec["region_step_ms"] = time_ms(lambda: step.fn(sx), warmup=3, rep=a.rep)
            mask = sx[0]
            rec["token_count_ms"] = time_ms(lambda: int((mask != 0).sum()), warmup=3, rep=a.rep)  # the host sync
        br = state["runner"]
        rec["region_note"] = br.note
        rec["buckets"] = sorted(br.buckets)
        bucket = next(iter(br.buckets.values()))
        if bucket.graph is not None:
            rec["bucket_replay_ms"] = time_ms(lambda: bucket.graph.replay(), warmup=3, rep=a.rep)
        inner = state["plan"]
        rec["inner_steps"] = len(inner.steps)
        r = br.region
        tb = rec["buckets"][0]
        gather, _, cu = device_token_index(bucket.inputs[0], tb)
        ins = [
            pack(x, gather, r.batch, r.seq, f) if md == "pack" else x
            for x, md, f in zip(bucket.inputs[1:], r.modes, r.in_flat, strict=True)
        ]
        rows = profile_plan(inner, ins + [cu], warmup=1, rep=5)
        rec["inner_profile_summary"] = profile_summary(rows)
        rec["inner_profile_top"] = [
            {k2: r[k2] for k2 in ("kernel", "template", "ops", "time_ms")} for r in sorted(rows, key=lambda r: -r["time_ms"])[:15]
        ]
        try:
            outer = profile_plan(v.plan, list(runner.static_inputs), warmup=1, rep=5) if runner is not None else []
        except Exception as e:  # noqa: BLE001 - a diagnostic: say why and go on
            rec["outer_profile_error"] = f"{type(e).__name__}: {e}"
            outer = []
        rec["outer_profile"] = [{k2: r[k2] for k2 in ("kernel", "template", "time_ms")} for r in outer]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "varlen_breakdown.json").write_text(json.dumps(rec, indent=1, default=str))
    print(json.dumps({k: rec[k] for k in rec if not k.startswith(("inner_profile_top", "outer_profile"))}, indent=1, default=str))
    for r in rec["inner_profile_top"]:
        print(f"  {r['kernel']:28s} {r['template']:26s} {r['time_ms']:.4f} ms")
    for r in rec["outer_profile"]:
        print(f"  outer {r['kernel']:22s} {r['template']:26s} {r['time_ms']:.4f} ms")


if __name__ == "__main__":
    main()
