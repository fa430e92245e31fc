"""Green-context SM partitions on this GPU (issue 8, session 50): do they exist, are the two sides' SMs disjoint,
and what does an LC kernel pay for the SMs it gives up, against what a BE kernel gets on them?

    PYTHONPATH=. python benchmarks/experiments/green_probe.py --out $OUT

For each BE SM count S: the partition's SM counts; the SMs a long grid reaches on each stream (%smid); then for
BERT-base B8 S128's GEMM shapes (fp16, cuBLAS through torch.matmul) and one memory-bound LC op: the LC op alone
on the whole GPU, alone on its N - S SMs, and beside a BE kernel (kfuse's colocate workloads) on the other S;
the BE slice alone on the whole GPU and alone on its S SMs. Overlap = (T_lc + T_be - T_pair) / (T_lc + T_be)
with T_be the slice's whole-GPU time, as for the fused versions. Writes green_probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def events_ms(fn: Callable[[], Any], reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        torch.cuda._sleep(200_000)  # the window holds GPU time only: the work is queued before the start event fires
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def on(stream: torch.cuda.Stream, fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        cur = torch.cuda.current_stream()
        stream.wait_stream(cur)
        with torch.cuda.stream(stream):
            fn()
        cur.wait_stream(stream)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--be-sms", default="16,32,48,64")
    ap.add_argument("--be", default="sgemm,lbm,mriq,cutcp,stencil7")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from kfuse.colocate import ptb, workloads
    from kfuse.colocate.green import GreenContextError, run_partitioned, sm_ids, split_sms

    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rec: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda, "sms": n_sms}
    print(f"{rec['gpu']} torch {rec['torch']} cuda {rec['cuda']} SMs {n_sms}", flush=True)
    t0 = time.perf_counter()
    rec["default_stream_sms"] = len(sm_ids(torch.cuda.current_stream()))
    try:  # a Triton kernel (a module loaded in the primary context) launched on a green context's stream (session 50: works)
        rec["triton_on_green_stream"] = len(sm_ids(split_sms(32).be_stream))
    except Exception as e:  # noqa: BLE001 - recorded: nothing below can run then
        rec["triton_on_green_stream"] = f"{type(e).__name__}: {e}"
        print(f"Triton on a green stream failed: {e}", flush=True)
        json.dump(rec, open(os.path.join(a.out, "green_probe.json"), "w"), indent=1)
        return
    parts = {}
    for s in (int(x) for x in a.be_sms.split(",")):
        try:
            p = split_sms(s)
        except GreenContextError as e:
            print(f"S={s}: {e}", flush=True)
            rec.setdefault("errors", {})[s] = str(e)
            continue
        lc_ids, be_ids = sm_ids(p.lc_stream), sm_ids(p.be_stream)
        rec.setdefault("partitions", {})[s] = {"lc_sms": p.lc_sms, "be_sms": p.be_sms, "lc_reached": len(lc_ids), "be_reached": len(be_ids),
                                               "shared": len(lc_ids & be_ids)}  # fmt: skip
        print(f"S={s}: {p.describe()}; reached LC {len(lc_ids)}, BE {len(be_ids)}, shared {len(lc_ids & be_ids)}", flush=True)
        parts[s] = p
    if not parts:
        json.dump(rec, open(os.path.join(a.out, "green_probe.json"), "w"), indent=1)
        return
    dev, dt = "cuda", torch.float16
    lcs: dict[str, Callable[[], Any]] = {}
    for m, n, k in ((1024, 2304, 768), (1024, 768, 768), (1024, 3072, 768), (1024, 768, 3072)):
        x, w = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
        lcs[f"mm{m}x{n}x{k}"] = lambda x=x, w=w: torch.matmul(x, w)
    h = torch.randn(1024, 768, device=dev, dtype=dt)
    lcs["layer_norm1024x768"] = lambda: torch.nn.functional.layer_norm(h, (768,))
    q = torch.randn(8, 12, 128, 64, device=dev, dtype=dt)
    lcs["sdpa8x12x128x64"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)
    rows = []
    for be_name in a.be.split(","):
        w = workloads.make(workloads.resolve(be_name), device=dev)
        bk = w.kernel
        for lc_name, lc in lcs.items():
            t_lc = events_ms(lc)
            for p in parts.values():
                t_lc_part = events_ms(on(p.lc_stream, lc))
                # a BE slice sized so that it runs about as long as the LC op on its S SMs
                t_blk = events_ms(on(p.be_stream, lambda: ptb.launch_ptb(bk, 0, bk.n_blocks, bk.n_blocks))) / bk.n_blocks
                nb = max(1, min(bk.n_blocks, int(t_lc_part / max(t_blk, 1e-6))))
                be = lambda nb=nb: ptb.launch_ptb(bk, 0, nb, nb)  # noqa: E731
                t_be = events_ms(be)
                t_be_part = events_ms(on(p.be_stream, be))
                t_pair = events_ms(lambda p=p, be=be: run_partitioned(p, lc, be))
                ov = (t_lc + t_be - t_pair) / (t_lc + t_be)
                row = {"be": be_name, "lc": lc_name, "be_sms": p.be_sms, "t_lc": t_lc, "t_lc_part": t_lc_part, "be_blocks": nb,
                       "t_be": t_be, "t_be_part": t_be_part, "t_pair": t_pair, "overlap": ov}  # fmt: skip
                rows.append(row)
                us = f"lc {t_lc * 1e3:7.1f} part {t_lc_part * 1e3:7.1f} us | be {nb:5d} blk {t_be * 1e3:7.1f} part {t_be_part * 1e3:7.1f}"
                print(f"{be_name:9s} {lc_name:22s} S={p.be_sms:3d} {us} | pair {t_pair * 1e3:7.1f} us overlap {ov:+.1%}", flush=True)
    rec["rows"] = rows
    rec["seconds"] = time.perf_counter() - t0
    json.dump(rec, open(os.path.join(a.out, "green_probe.json"), "w"), indent=1)
    print("\nbest overlap per (BE, S), mean over LC ops:")
    for be_name in a.be.split(","):
        for s in parts:
            ovs = [r["overlap"] for r in rows if r["be"] == be_name and r["be_sms"] == parts[s].be_sms]
            print(f"  {be_name:9s} S={parts[s].be_sms:3d} mean {statistics.mean(ovs):+.1%} min {min(ovs):+.1%} max {max(ovs):+.1%}")


if __name__ == "__main__":
    main()
