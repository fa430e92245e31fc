"""GPU probe: the resident-B GEMM (``gemm_tma_resident_kernel``) on the 256-wide layers of issue 5's
GEMM chains, against cuBLAS and the best persistent TMA template config.

Question: the 256-wide chains y = relu(x @ W0^T + b0) @ W1^T + b1 run as two GEMMs of
M x 256 x 256 (fp16). Each GEMM is memory-bound (128 FLOP/byte < the H200's ridge of ~184):
134 MB in and 134 MB out at M = 262144, a floor of 0.0624 ms at 4.3 TB/s. cuBLAS ``mm`` alone
takes 0.0748 ms (3.6 TB/s), cuBLASLt with the bias epilogue 0.0844-0.0871, the template's best
0.0831 (session 8). The template re-reads its B tile from L2 for every output tile; the
resident kernel loads B once per program and streams only A in and C out.

Prediction (docs/perf-notes.md, session 14): the resident kernel with bias(+ReLU) reaches
3.6-3.9 TB/s, 0.069-0.075 ms at M = 262144 (0.27-0.30 ms at M = 1M), so the unfused chain
drops from 0.170 to 0.14-0.15 ms, 1.6-1.75x of the 0.087 ms compute floor.

Each timing replays a CUDA graph of 20 calls (ms per call, median of 30 replays), as b2b_bench
does. Every kfuse output is checked against the fp32 reference in the same run (NaN-poisoned
output before the first launch). Writes ``resident_gemm_probe.json`` under ``--out``.

    PYTHONPATH=. python benchmarks/experiments/resident_gemm_probe.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.getcwd())
from kfuse.bench.harness import graph_ms_per_call, max_rel_err  # noqa: E402
from kfuse.ir import ops  # noqa: E402,F401 - registers the ops the epilogue references
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand  # noqa: E402
from kfuse.kernels.gemm import GemmConfig, gemm_epilogue  # noqa: E402

BIAS = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))),), 1)
BIAS_RELU = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)

# run 1 (session 14): 64x128x256 w4 s4 best (79.1 us at M = 262144); the 128 KB B blocks with
# 1-2 stages 120-138 us (one A tile in flight per SM). Run 2 adds more stages, narrower B
# blocks and two programs per SM (resident_programs_per_sm).
RESIDENT = [
    GemmConfig(64, 128, 256, 1, 4, 4, tma=True, resident_b=True),
    GemmConfig(64, 128, 256, 1, 8, 4, tma=True, resident_b=True),
    GemmConfig(64, 64, 256, 1, 4, 2, tma=True, resident_b=True),  # 2 programs / SM
    GemmConfig(64, 64, 256, 1, 4, 4, tma=True, resident_b=True),
    GemmConfig(64, 64, 256, 1, 4, 5, tma=True, resident_b=True),
    GemmConfig(128, 64, 256, 1, 4, 2, tma=True, resident_b=True),
    GemmConfig(128, 64, 256, 1, 8, 2, tma=True, resident_b=True),
    GemmConfig(64, 32, 256, 1, 4, 2, tma=True, resident_b=True),  # 2 programs / SM
    GemmConfig(64, 32, 256, 1, 4, 3, tma=True, resident_b=True),  # 2 programs / SM
    GemmConfig(64, 256, 256, 1, 4, 2, tma=True, resident_b=True),
]
TEMPLATE = [
    GemmConfig(128, 128, 64, 8, 4, 5, persistent=True, tma=True, flatten=True),  # session 8's best at this shape
]


def graph_ms(fn: Any) -> float:
    """ms per call: a CUDA graph of 20 back-to-back calls, median over 30 replays."""
    return graph_ms_per_call(fn, (), calls=20, rep=30)[0]


def probe_gemm(m: int, width: int) -> list[dict[str, Any]]:
    """One M x width x width GEMM with bias + ReLU: cuBLAS variants, template configs, resident configs."""
    torch.manual_seed(0)
    x = torch.randn(m, width, device="cuda", dtype=torch.float16)
    w = torch.randn(width, width, device="cuda", dtype=torch.float16) / width**0.5  # nn.Linear weight (N, K)
    b = torch.randn(width, device="cuda", dtype=torch.float16)
    ref = torch.relu(x.float() @ w.float().t() + b.float())
    floor = max(2 * m * width * width / 790e12, 2 * (2 * m * width) / 4.3e12) * 1e3
    rows: list[dict[str, Any]] = []

    def row(name: str, fn: Any, out: torch.Tensor | None) -> None:
        r: dict[str, Any] = {"m": m, "width": width, "variant": name, "floor_ms": floor}
        try:
            if out is not None:
                out.fill_(float("nan"))
            got = fn()
            torch.cuda.synchronize()
            r["rel_err"] = max_rel_err(got, ref) if out is not None or name.startswith("cublaslt") else None
            r["ms"] = graph_ms(fn)
            r["tb_s"] = 2 * (2 * m * width) / (r["ms"] * 1e-3) / 1e12
        except Exception as e:  # noqa: BLE001 - a failing variant is a result
            r["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''}"
        rows.append(r)
        what = f"{r['ms'] * 1e3:7.1f} us {r['tb_s']:.2f} TB/s err {r.get('rel_err')}" if "ms" in r else r["error"]
        print(f"  M{m} w{width} {name:42s} {what}", flush=True)

    wt = w.t()
    row("cublas_mm (no epilogue)", lambda: x @ wt, None)
    row("cublaslt_addmm_relu", lambda: torch._addmm_activation(b, x, wt), None)
    row("cublaslt_addmm (bias only)", lambda: torch.addmm(b, x, wt), None)
    out = torch.empty(m, width, device="cuda", dtype=torch.float16)
    for cfg in TEMPLATE + RESIDENT:
        row(f"kfuse {cfg.describe()}", lambda cfg=cfg: gemm_epilogue(x, wt, [b], BIAS_RELU, torch.float16, cfg, out=out), out)
    return rows


def probe_chain(m: int, width: int, cfgs: list[GemmConfig]) -> list[dict[str, Any]]:
    """The whole unfused chain relu(x W0^T + b0) W1^T + b1 as two kfuse GEMMs with ``cfg`` vs two cuBLASLt calls."""
    torch.manual_seed(1)
    x = torch.randn(m, width, device="cuda", dtype=torch.float16)
    w0, w1 = (torch.randn(width, width, device="cuda", dtype=torch.float16) / width**0.5 for _ in range(2))
    b0, b1 = (torch.randn(width, device="cuda", dtype=torch.float16) for _ in range(2))
    ref = torch.relu(x.float() @ w0.float().t() + b0.float()).half().float() @ w1.float().t() + b1.float()
    floor = 2 * 2 * m * width * width / 790e12 * 1e3
    h = torch.empty(m, width, device="cuda", dtype=torch.float16)
    y = torch.empty(m, width, device="cuda", dtype=torch.float16)
    rows = []
    lib = lambda: torch.addmm(b1, torch._addmm_activation(b0, x, w0.t()), w1.t())  # noqa: E731
    r = {"m": m, "width": width, "variant": "chain cublaslt pair", "floor_ms": floor}
    r.update(rel_err=max_rel_err(lib(), ref), ms=graph_ms(lib))
    rows.append(r)
    print(f"  chain M{m} {r['variant']:40s} {r['ms'] * 1e3:7.1f} us ({r['ms'] / floor:.2f}x floor)", flush=True)
    for cfg in cfgs:

        def run(cfg: GemmConfig = cfg) -> torch.Tensor:
            gemm_epilogue(x, w0.t(), [b0], BIAS_RELU, torch.float16, cfg, out=h)
            return gemm_epilogue(h, w1.t(), [b1], BIAS, torch.float16, cfg, out=y)

        y.fill_(float("nan"))
        r = {"m": m, "width": width, "variant": f"chain kfuse {cfg.describe()}", "floor_ms": floor}
        try:
            r["rel_err"] = max_rel_err(run(), ref)
            r["ms"] = graph_ms(run)
            x_floor = r["ms"] / floor
            print(f"  chain M{m} {r['variant']:40s} {r['ms'] * 1e3:7.1f} us ({x_floor:.2f}x floor) err {r['rel_err']:.2e}", flush=True)
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print("  ", r["variant"], r["error"], flush=True)
        rows.append(r)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--ms", default="65536,262144,1048576")
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    t0 = time.time()
    rows: list[dict[str, Any]] = []
    ms = [int(v) for v in args.ms.split(",")]
    for m in ms:
        rows += probe_gemm(m, args.width)
    best = sorted((r for r in rows if r["variant"].startswith("kfuse") and "ms" in r and r["m"] == ms[-1] and (r["rel_err"] or 0) < 2e-2),
                  key=lambda r: r["ms"])  # fmt: skip
    chain_cfgs = [c for c in TEMPLATE + RESIDENT if any(f"kfuse {c.describe()}" == r["variant"] for r in best[:3])]
    for m in ms:
        rows += probe_chain(m, args.width, chain_cfgs)
    meta = {"command": " ".join(sys.argv), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "wall_s": time.time() - t0}  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "resident_gemm_probe.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print("\nvariant                                          " + "  ".join(f"M{m:>8}" for m in ms))
    for v in dict.fromkeys(r["variant"] for r in rows):
        cells = []
        for m in ms:
            r = next((r for r in rows if r["variant"] == v and r["m"] == m), None)
            cells.append(f"{r['ms'] * 1e3:8.1f}" if r and "ms" in r else "       -")
        print(f"{v:48s} " + "  ".join(cells) + " us")


if __name__ == "__main__":
    main()
