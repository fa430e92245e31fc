"""Issue 5 exploration on the GPU: does running a wide GEMM chain in row chunks, so that its
intermediate stays in L2, beat the plain unfused pair?

The 256-wide chains relu(x @ W0 + b0) @ W1 + b1 stay unfused (the fused kernel streams both
256 x 256 weights through shared memory per tile and measured 0.227-0.247 ms against the pair's
0.173 at M = 262144). The pair is memory-bound: each GEMM moves 268 MB (x and h, or h and y) for
34 GFLOP, so the two read and write the intermediate h (134 MB) through HBM. In chunks of C rows,
h is a reused C x 256 buffer (C = 32768: 16 MB, a third of the H200's 50 MB L2), written by the
first GEMM and read by the second while still in L2, and overwritten by the next chunk before it
is evicted. Predicted: HBM traffic 537 -> 268 MB, so each GEMM compute-bound (~0.06 ms instead of
0.086 at M = 262144) and the chain at ~0.125-0.14 ms (floor 0.087: from 1.97x to ~1.5x). Too small
a chunk pays in waves (C = 4096: 64 row tiles of 128 on 132 SMs) and launches.

Every variant runs 10 calls per CUDA graph; its output is checked against the plain pair.

    PYTHONPATH=. python benchmarks/experiments/l2_chunk_probe.py --out $OUT      # H200, ~60 s
    PYTHONPATH=. python benchmarks/experiments/l2_chunk_probe.py --out /tmp/x --smoke  # CPU wiring
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kfuse.bench.harness import gpu_name, graph_ms_per_call, max_rel_err

CHUNKS = (4096, 8192, 16384, 32768, 65536, 131072)


def pair(x: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
    return torch.addmm(b1, torch._addmm_activation(b0, x, w0), w1)


def chunked(
    x: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, h: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    c = h.shape[0]
    for s in range(0, x.shape[0], c):
        e = min(s + c, x.shape[0])
        hs = h[: e - s]
        torch._addmm_activation(b0, x[s:e], w0, out=hs)
        torch.addmm(b1, hs, w1, out=y[s:e])
    return y


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: wiring only")
    p.add_argument("--width", type=int, default=256)
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.float16 if dev == "cuda" else torch.float32
    ms = (1000, 4096) if args.smoke else (65536, 262144, 1048576)
    chunks = (256, 1024) if args.smoke else CHUNKS
    n = args.width
    torch.manual_seed(0)
    w0, w1 = (torch.randn(n, n, device=dev, dtype=dt) / n**0.5 for _ in range(2))
    b0, b1 = (torch.randn(n, device=dev, dtype=dt) for _ in range(2))
    recs: list[dict[str, Any]] = []
    for m in ms:
        x = torch.randn(m, n, device=dev, dtype=dt)
        flops = 4.0 * m * n * n
        floor = max(flops / 790e12, 2.0 * 2 * m * n / 4.3e12) * 1e3
        t_pair, ref = graph_ms_per_call(pair, (x, w0, b0, w1, b1), calls=10)
        row = {"m": m, "width": n, "floor_ms": floor, "pair_ms": t_pair, "chunks": {}}
        print(f"M={m}: pair {t_pair:.4f} ms ({t_pair / floor:.2f}x floor {floor:.4f})", flush=True)
        for c in chunks:
            if c >= m:
                continue
            h = torch.empty(c, n, device=dev, dtype=dt)
            y = torch.empty(m, n, device=dev, dtype=dt)
            y.fill_(float("nan"))  # poisoned: every row must be written
            t, out = graph_ms_per_call(chunked, (x, w0, b0, w1, b1, h, y), calls=10)
            err = max_rel_err(out, ref)
            row["chunks"][c] = {"ms": t, "err": err, "h_mb": c * n * 2 / 2**20}
            print(f"  chunk {c:7d} (h {c * n * 2 / 2**20:6.1f} MB): {t:.4f} ms ({t / floor:.2f}x floor) err {err:.1e}", flush=True)
        recs.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"experiment": "l2_chunk_probe", "gpu": gpu_name(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
    res["records"] = recs
    (args.out / "l2_chunk_probe.json").write_text(json.dumps(res, indent=1))
    print(f"{'M':>8} {'pair':>8} {'best chunk':>10} {'ms':>8} {'x floor':>8}")
    for r in recs:
        best = min(r["chunks"].items(), key=lambda kv: kv[1]["ms"], default=(0, {"ms": float("nan")}))
        print(f"{r['m']:8d} {r['pair_ms']:8.4f} {best[0]:10d} {best[1]['ms']:8.4f} {best[1]['ms'] / r['floor_ms']:8.2f}")


if __name__ == "__main__":
    main()
