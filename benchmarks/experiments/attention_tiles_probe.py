"""The attention kernel's key-tile loops A/B in one process (session 23): every tile masked (``TILES``
0, the kernel as it was before session 23), interior tiles unmasked with the edge tiles masked (1),
and one unmasked loop where every tile is whole (2, dense non-causal only). The same tuned tile for
all variants, each replayed from its own CUDA graph, timed in rotated rounds; outputs checked
against SDPA.

Question: the standalone attention bench measured the split kernel faster at S512 (0.0454 vs 0.0509
ms, B16 H12 D64) and causal (Llama B1 8.9 us in the plan against 12.4), but the S128 case slower
relative to flash SDPA (0.0173 vs flash 0.0187, where session 4 had 0.0134 vs 0.0167). Which loop
form is fastest where, in one process?

    PYTHONPATH=. python benchmarks/experiments/attention_tiles_probe.py --out $OUT   # H200, ~40 s
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
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    natural = A.key_tiles
    rows = []
    for b, h, kvh, s, d, causal in CASES:
        case = f"B{b}_H{h}_KV{kvh}_S{s}_D{d}" + ("_causal" if causal else "")
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16)
        k, v = (torch.randn(b, kvh, s, d, generator=gen).to("cuda", torch.float16) for _ in range(2))
        ref = F.scaled_dot_product_attention(q, k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1), is_causal=causal)
        A.attention(q, k, v, causal=causal)  # tunes the tile once, with the natural loop form
        cfg = A.tuned_config(s, d, b * h, causal=causal)
        graphs, errs = {}, {}
        variants = [0, 1] + ([2] if not causal and s % cfg.block_n == 0 else [])
        for t in variants:
            A.key_tiles = lambda *a, t=t: t  # noqa: E731 - the launcher asks at every launch (captured in the graph)
            try:
                errs[t] = max_rel_err(A.attention(q, k, v, causal=causal, config=cfg), ref)
                graphs[t] = graph_or_plain(lambda: A.attention(q, k, v, causal=causal, config=cfg))
            finally:
                A.key_tiles = natural
        ms = interleaved_medians(variants, lambda t: time_ms(graphs[t], warmup=5, rep=50), args.rounds)
        rows.append({"case": case, "config": cfg.describe(), "natural": natural(cfg, 0, causal, False, s), "ms": ms, "max_rel_err": errs})
        print(
            f"{case:28s} {cfg.describe():14s} " + "  ".join(f"tiles {t}: {ms[t] * 1e3:7.2f} us (err {errs[t]:.1e})" for t in variants),
            flush=True,
        )
    write_experiment("attention_tiles_probe", args.out, rows=rows, rounds=args.rounds)
    print(f"{'case':28s} {'tiles 0 (before)':>18s} {'1 (split)':>10s} {'2 (one loop)':>13s}  us")
    for r in rows:
        m = r["ms"]
        print(f"{r['case']:28s} {m[0] * 1e3:18.2f} {m[1] * 1e3:10.2f} " + (f"{m[2] * 1e3:13.2f}" if 2 in m else f"{'-':>13s}"))


if __name__ == "__main__":
    main()
