"""The attention kernel's exponent forms A/B in one process (session 24): scores scaled first (an FMUL
of every score, then exp2(s - max)) against one FFMA of the unscaled score, exp2(qk * scale - max)
(``attention.FMA_SCALE``). The tuned tile for both, each replayed from its own CUDA graph, timed in
rotated rounds; outputs checked against SDPA.

Prediction (docs/perf-notes.md, session 24): one FP32 instruction fewer of about 5.5 a score; 3-6% on
S512 dense and causal, 0-2% at S128.

    PYTHONPATH=. python benchmarks/experiments/attention_fma_probe.py --out $OUT   # H200, ~50 s
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from kfuse.bench.harness import graph_or_plain, interleaved_medians, max_rel_err, time_ms, write_experiment
from kfuse.kernels import attention as A

CASES = [  # b, heads, kv heads, s, d, causal
    (32, 12, 12, 128, 64, False),
    (16, 12, 12, 512, 64, False),
    (8, 12, 12, 512, 128, False),
    (1, 32, 4, 512, 64, True),
    (8, 32, 4, 512, 64, True),
    (8, 12, 12, 512, 64, True),
    (4, 32, 8, 1024, 128, True),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rows = []
    for b, h, kvh, s, d, causal in CASES:
        case = f"B{b}_H{h}_KV{kvh}_S{s}_D{d}" + ("_causal" if causal else "")
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16)
        k, v = (torch.randn(b, kvh, s, d, generator=gen).to("cuda", torch.float16) for _ in range(2))
        kr, vr = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
        ref = F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
        A.attention(q, k, v, causal=causal)  # tunes the tile once, with the FFMA form
        cfg = A.tuned_config(s, d, b * h, causal=causal)
        graphs, errs = {}, {}
        for form in (False, True):
            A.FMA_SCALE = form  # read at every launch: captured in each graph
            errs[form] = max_rel_err(A.attention(q, k, v, causal=causal, config=cfg), ref)
            graphs[form] = graph_or_plain(lambda: A.attention(q, k, v, causal=causal, config=cfg))
        A.FMA_SCALE = True
        graphs["flash"] = graph_or_plain(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=causal))
        ms = interleaved_medians(list(graphs), lambda f: time_ms(graphs[f], warmup=5, rep=50), args.rounds)
        named = {str(k): v for k, v in ms.items()}
        rows.append({"case": case, "config": cfg.describe(), "ms": named, "max_rel_err": {str(k): v for k, v in errs.items()}})
        us = "  ".join(f"{n} {named[n] * 1e3:7.2f}" for n in ("False", "True", "flash"))
        print(f"{case:30s} {cfg.describe():20s} (scaled first: False, FFMA: True) {us} us", flush=True)
    write_experiment("attention_fma_probe", args.out, rows=rows, rounds=args.rounds)
    print(f"\n{'case':30s} {'tile':>20s} {'scaled':>8s} {'ffma':>8s} {'change':>7s} {'flash':>8s}  (us)")
    for r in rows:
        m = r["ms"]
        a, f = m["False"], m["True"]
        print(f"{r['case']:30s} {r['config']:>20s} {a * 1e3:8.2f} {f * 1e3:8.2f} {(f / a - 1) * 100:+6.1f}% {m['flash'] * 1e3:8.2f}")


if __name__ == "__main__":
    main()
