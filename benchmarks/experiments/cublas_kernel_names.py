"""Which kernels cuBLAS (``torch.mm``) and cuBLASLt's fused bias + GELU (``torch._addmm_activation``)
run on issue 3's twelve BERT / GPT-2 shapes, read from the PyTorch profiler: the names carry the
tile, the cluster shape and the schedule (ping-pong / cooperative, stream-K), which say what kfuse's
Gluon kernels (``kfuse/kernels/gemm_ws.py``) are up against. No hardware counters needed.

    PYTHONPATH=. python benchmarks/experiments/cublas_kernel_names.py --out $OUT   # H200, ~10 s
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from kfuse.bench.harness import write_experiment

LAYERS = {"qkv": (768, 2304), "attn_out": (768, 768), "ffn1": (768, 3072), "ffn2": (3072, 768)}  # (K, N)
MODELS = {"bert": (4096, 16384), "gpt2": (8192,)}


def kernels_of(fn) -> list[dict]:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            r = rows.setdefault(e.name, {"name": e.name, "calls": 0, "us": 0.0})
            r["calls"] += 1
            r["us"] += e.device_time
    return [{**r, "us": r["us"] / max(1, r["calls"])} for r in rows.values()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev, dt = "cuda", torch.float16
    recs = []
    for mdl, toks in MODELS.items():
        for m in toks:
            for layer, (k, n) in LAYERS.items():
                a = torch.randn(m, k, device=dev, dtype=dt)
                b = (torch.randn(k, n, device=dev) / k**0.5).to(dt)
                bias = torch.randn(n, device=dev, dtype=dt)
                rec = {"case": f"{mdl}_T{m}_{layer}", "m": m, "n": n, "k": k,
                       "mm": kernels_of(lambda: torch.mm(a, b)),
                       "addmm_gelu": kernels_of(lambda: torch._addmm_activation(bias, a, b, use_gelu=True))}  # fmt: skip
                recs.append(rec)
                for what in ("mm", "addmm_gelu"):
                    for r in rec[what]:
                        print(f"{rec['case']:22s} {what:10s} {r['us']:7.1f} us  {r['name']}", flush=True)
    write_experiment("cublas_kernel_names", args.out, records=recs)


if __name__ == "__main__":
    main()
