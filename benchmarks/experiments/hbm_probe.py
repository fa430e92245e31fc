"""What DRAM bandwidth does the H200 give a streaming kernel that reads one tensor and writes
another of the same size (the shape of a memory-bound GEMM such as M = 1M, 256 x 256)?

The 256-wide GEMM chain at M = 1M runs each of its GEMMs at ~3.2 TB/s (session 14: 327-341 us
per GEMM, cuBLAS and kfuse alike). If a plain copy also runs at ~3.2 TB/s, that is the ceiling and
the unfused pair cannot get further from its 2x-floor line; if a copy runs at 3.8+ TB/s, the
GEMMs leave bandwidth unused. Times (CUDA graph, 10 calls per replay, median) for: ``copy_``
(read + write), ``sum`` (read only), ``fill_`` (write only), ``add`` (read + write), at 128 MB and
512 MB per tensor, fp16.

    PYTHONPATH=. python benchmarks/experiments/hbm_probe.py --out $OUT   # H200, ~15 s
"""

from __future__ import annotations

import argparse

import torch

from kfuse.bench.harness import graph_ms_per_call, write_experiment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    recs = []
    for mb in (128, 512):
        n = mb * (1 << 20) // 2
        x = torch.randn(n, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        acc = torch.empty(1, device="cuda", dtype=torch.float32)
        cases = {
            "copy": (lambda: y.copy_(x), 2),
            "add": (lambda: torch.add(x, 1.0, out=y), 2),
            "sum": (lambda: torch.sum(x.view(1, -1), dim=1, dtype=torch.float32, out=acc), 1),
            "fill": (lambda: y.fill_(1.0), 1),
        }
        for name, (fn, tensors) in cases.items():
            ms, _ = graph_ms_per_call(fn, (), calls=10, rep=15)
            tbs = tensors * n * 2 / (ms * 1e-3) / 1e12
            recs.append({"case": f"{name}_{mb}MB", "ms": ms, "tb_per_s": tbs})
            print(f"{name:5s} {mb:4d} MB  {ms:8.4f} ms  {tbs:5.2f} TB/s", flush=True)
    write_experiment("hbm_probe", a.out, records=recs)


if __name__ == "__main__":
    main()
