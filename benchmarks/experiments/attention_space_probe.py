"""Tiles outside the attention autotuner's space, and SDPA's backends, in one process (session 24).

The config space keeps key tiles at 64 or fewer for head dim 128 and never tries 128 x 128. PyTorch's
default SDPA dispatch measured 30.9 us at B8 H12 S512 D128 where kfuse's tuned kernel took 46.2 and
forced flash 52.5 (`experiments/s24_attention_fma_probe.json`, `attention.json`). Does a larger tile
close part of that? Each tile replayed from its own CUDA graph, rotated rounds, checked against SDPA;
a tile the compiler rejects is reported and skipped.

    PYTHONPATH=. python benchmarks/experiments/attention_space_probe.py --out $OUT   # H200, ~60 s
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kfuse.bench.harness import graph_or_plain, interleaved_medians, max_rel_err, time_ms, write_experiment
from kfuse.kernels import attention as A

CASES = [  # b, heads, kv heads, s, d, causal
    (8, 12, 12, 512, 128, False),
    (16, 12, 12, 512, 64, False),
    (8, 32, 4, 512, 64, True),
    (4, 32, 8, 1024, 128, True),
]
TILES = [
    A.AttnConfig(64, 64, 4, 2),
    A.AttnConfig(64, 64, 4, 3),
    A.AttnConfig(128, 64, 8, 2),
    A.AttnConfig(128, 64, 8, 3),
    A.AttnConfig(64, 128, 4, 2),
    A.AttnConfig(128, 128, 8, 2),
    A.AttnConfig(128, 128, 8, 3),
]
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for b, h, kvh, s, d, causal in CASES:
        case = f"B{b}_H{h}_KV{kvh}_S{s}_D{d}" + ("_causal" if causal else "")
        gen = torch.Generator().manual_seed(3)
        q = torch.randn(b, h, s, d, generator=gen).to("cuda", torch.float16)
        k, v = (torch.randn(b, kvh, s, d, generator=gen).to("cuda", torch.float16) for _ in range(2))
        kr, vr = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
        ref = F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)
        sides, errs, failed = {}, {}, {}
        variants = {t.describe(): t for t in TILES}
        if causal:
            variants.update({t.describe() + " paired": A.AttnConfig(t.block_m, t.block_n, t.num_warps, t.num_stages, True) for t in TILES})
        for name, cfg in variants.items():
            try:
                errs[name] = max_rel_err(A.attention(q, k, v, causal=causal, config=cfg), ref)
                sides[name] = graph_or_plain(lambda cfg=cfg: A.attention(q, k, v, causal=causal, config=cfg))
            except Exception as e:  # out of shared memory or registers for this head dim
                failed[name] = f"{type(e).__name__}: {str(e)[:100]}"
                torch.cuda.synchronize()
        for name, backend in BACKENDS.items():

            def run(backend=backend):  # noqa: ANN001, ANN202
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, kr, vr, is_causal=causal)

            try:
                errs["sdpa_" + name] = max_rel_err(run(), ref)
                sides["sdpa_" + name] = graph_or_plain(run)
            except Exception as e:  # noqa: BLE001 - backend not available here
                failed["sdpa_" + name] = f"{type(e).__name__}: {str(e)[:100]}"
        sides["sdpa_default"] = graph_or_plain(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=causal))
        ms = interleaved_medians(list(sides), lambda n: time_ms(sides[n], warmup=5, rep=30), args.rounds)
        rows.append({"case": case, "ms": ms, "max_rel_err": errs, "failed": failed})
        print(f"== {case}", flush=True)
        for n in sorted(ms, key=ms.__getitem__):
            print(f"  {n:26s} {ms[n] * 1e3:8.2f} us" + (f"  err {errs[n]:.1e}" if n in errs else ""), flush=True)
        for n, why in failed.items():
            print(f"  {n:26s} failed: {why}", flush=True)
    write_experiment("attention_space_probe", args.out, rows=rows, rounds=args.rounds)


if __name__ == "__main__":
    main()
