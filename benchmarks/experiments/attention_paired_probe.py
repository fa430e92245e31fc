"""Paired causal query tiles A/B in one process (session 24).

A causal program of 64 query rows at S=512 sees 1 to 8 key tiles; the paired form runs the tile with
the most keys and its mirror with the fewest in one program (9 key tiles each, half the programs).
For each causal case: the same tiles unpaired and paired, each replayed from its own CUDA graph,
timed in rotated rounds (median), outputs checked against SDPA; and the autotuner's pick, whose space
now holds both forms, beside flash SDPA.

    PYTHONPATH=. python benchmarks/experiments/attention_paired_probe.py --out $OUT   # H200, ~60 s
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F

from kfuse.bench.harness import graph_or_plain, interleaved_medians, max_rel_err, time_ms, write_experiment
from kfuse.kernels import attention as A

CASES = [  # b, heads, kv heads, s, d: Llama-1b (GQA 32/4) at B1 and B8, GPT-2 small B8, a long row, head dim 128
    (1, 32, 4, 512, 64),
    (8, 32, 4, 512, 64),
    (8, 12, 12, 512, 64),
    (1, 32, 4, 2048, 64),
    (4, 32, 8, 1024, 128),
]
TILES = [A.AttnConfig(64, 64, 4, 3), A.AttnConfig(128, 64, 8, 3), A.AttnConfig(64, 64, 4, 2)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rows = []
    for b, h, kvh, s, d in CASES:
        case = f"B{b}_H{h}_KV{kvh}_S{s}_D{d}_causal"
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16)
        k, v = (torch.randn(b, kvh, s, d, generator=gen).to("cuda", torch.float16) for _ in range(2))
        kr, vr = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
        ref = F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
        A.attention(q, k, v, causal=True)  # the autotuner's pick, from a space with both forms
        tuned = A.tuned_config(s, d, b * h, causal=True)
        tiles = [t for t in TILES if d <= 64 or t.num_stages == 2]
        variants = {"tuned": tuned}
        for t in tiles:
            variants[t.describe()] = t
            variants[t.describe() + " paired"] = dataclasses.replace(t, paired=True)
        graphs, errs = {}, {}
        for name, cfg in variants.items():
            try:
                errs[name] = max_rel_err(A.attention(q, k, v, causal=True, config=cfg), ref)
                graphs[name] = graph_or_plain(lambda cfg=cfg: A.attention(q, k, v, causal=True, config=cfg))
            except Exception as e:  # a tile the compiler rejects for this head dim
                print(f"{case} {name}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        graphs["flash"] = graph_or_plain(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True))
        names = list(graphs)
        ms = interleaved_medians(names, lambda n: time_ms(graphs[n], warmup=5, rep=50), args.rounds)
        rows.append({"case": case, "tuned": tuned.describe(), "ms": ms, "max_rel_err": errs})
        print(f"{case}: tuned {tuned.describe()}", flush=True)
        for n in names:
            print(f"  {n:24s} {ms[n] * 1e3:8.2f} us" + (f"  err {errs[n]:.1e}" if n in errs else ""), flush=True)
    write_experiment("attention_paired_probe", args.out, rows=rows, rounds=args.rounds)
    print(f"\n{'case':30s} {'tuned':>22s} {'us':>7s} {'flash':>7s} | " + " | ".join(f"{t.describe():>14s} unp / paired" for t in TILES))
    for r in rows:
        m = r["ms"]
        cells = []
        for t in TILES:
            a, p = m.get(t.describe()), m.get(t.describe() + " paired")
            cells.append(f"{a * 1e3:7.2f} / {p * 1e3:7.2f}" if a and p else f"{'-':>17s}")
        head = f"{r['case']:30s} {r['tuned']:>22s} {m['tuned'] * 1e3:7.2f} {m['flash'] * 1e3:7.2f} | "
        print(head + " | ".join(f"{c:>27s}" for c in cells))


if __name__ == "__main__":
    main()
