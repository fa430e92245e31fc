"""Experiment: why is the pointer-based GEMM template ~2x slower than cuBLAS on BERT shapes?

Compares, on the H200 (fp16, GEMM + bias + GELU, every kernel replayed 20x inside one CUDA graph):
  * kfuse's current template (cp.async pointer loads; ``kfuse.kernels.gemm``),
  * a TMA variant (host ``TensorDescriptor`` for A and B, same epilogue), one program per tile,
  * the TMA variant persistent (grid = #SMs, tile loop flattened with the K loop),
  * cuBLAS ``mm`` alone, ``addmm`` (bias in cuBLASLt), ``_addmm_activation(use_gelu=True)``
    (cuBLASLt bias+GELU epilogue, tanh approximation).
Writes ``gemm_variants.json`` and prints a table. Recorded in docs/perf-notes.md.

    PYTHONPATH=. python benchmarks/experiments/gemm_variants.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.getcwd())
from kfuse.ir import ops  # noqa: E402,F401
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand  # noqa: E402
from kfuse.kernels.gemm import GemmConfig, gemm_epilogue  # noqa: E402

EPI = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)


@triton.jit
def _coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + ((tile % group) % size_m), (tile % group) // size_m


@triton.jit
def _bias_gelu_store(acc, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm):
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = acc + tl.load(bias_ptr + offs_n, mask=offs_n < N)[None, :].to(tl.float32)
    acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = a_desc.load([pid_m * BLOCK_M, k])
        b = b_desc.load([k, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    _bias_gelu_store(
        acc, c_ptr, bias_ptr, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N), M, N, stride_cm
    )


@triton.jit
def tma_persistent_kernel(
    a_desc,
    b_desc,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        _bias_gelu_store(
            acc, c_ptr, bias_ptr, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N), M, N, stride_cm
        )


def graph_time_ms(fn, inner: int = 20, rep: int = 15) -> float:
    """Median per-call GPU time: ``inner`` calls captured in one CUDA graph, replayed ``rep`` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rep):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / inner)
    return statistics.median(ts)


CONFIGS = [
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 256, 32, 8, 4),
    (64, 256, 64, 4, 4),
]
SHAPES = [(4096, 3072, 768), (4096, 2304, 768), (4096, 768, 3072), (4096, 768, 768), (16384, 3072, 768), (8192, 768, 3072)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    t_start = time.perf_counter()
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m, n, k in SHAPES:
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16) / math.sqrt(k)
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        ref = F.gelu(a.float() @ b.float() + bias.float())
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        res: dict[str, float | str] = {"shape": f"{m}x{n}x{k}"}
        flops = 2 * m * n * k
        res["mm"] = graph_time_ms(lambda: torch.mm(a, b, out=out))
        res["addmm"] = graph_time_ms(lambda: torch.addmm(bias, a, b, out=out))
        res["addmm_gelu_lt"] = graph_time_ms(lambda: torch._addmm_activation(bias, a, b, use_gelu=True))
        res["err_addmm_gelu_lt"] = ((torch._addmm_activation(bias, a, b, use_gelu=True).float() - ref).abs().max() / ref.abs().max()).item()
        best: dict[str, tuple[float, str]] = {}
        for bm, bn, bk, w, st in CONFIGS:
            if time.perf_counter() - t_start > args.budget_s:
                break
            tag = f"{bm}x{bn}x{bk}w{w}s{st}"
            variants = {}
            cfg = GemmConfig(bm, bn, bk, 8, w, st)
            variants["kfuse"] = lambda cfg=cfg: gemm_epilogue(a, b, [bias], EPI, torch.float16, cfg, out=out)
            cfg_p = GemmConfig(bm, bn, bk, 8, w, st, persistent=True)
            variants["kfuse_persistent"] = lambda cfg=cfg_p: gemm_epilogue(a, b, [bias], EPI, torch.float16, cfg, out=out)
            a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
            b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            variants["tma"] = lambda: tma_kernel[grid](
                a_desc, b_desc, out, bias, m, n, k, out.stride(0), bm, bn, bk, 8, num_warps=w, num_stages=st
            )
            for flat in (False, True):
                pg = (min(n_sms, grid[0]),)
                variants[f"tma_persistent{'_flat' if flat else ''}"] = lambda pg=pg, flat=flat: tma_persistent_kernel[pg](
                    a_desc, b_desc, out, bias, m, n, k, out.stride(0), bm, bn, bk, 8, n_sms, flat, num_warps=w, num_stages=st
                )
            for name, fn in variants.items():
                try:
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    t = graph_time_ms(fn)
                    res[f"{name}@{tag}"] = t
                    if err < 1e-2 and (name not in best or t < best[name][0]):
                        best[name] = (t, tag)
                    if err >= 1e-2:
                        res[f"{name}@{tag}_err"] = err
                except Exception as e:  # noqa: BLE001
                    res[f"{name}@{tag}_fail"] = f"{type(e).__name__}: {str(e)[:160]}"
        for name, (t, tag) in best.items():
            res[f"best_{name}"] = t
            res[f"best_{name}_cfg"] = tag
            res[f"best_{name}_tflops"] = flops / t / 1e9
        res["mm_tflops"] = flops / res["mm"] / 1e9
        rows.append(res)
        print(
            json.dumps(
                {
                    k: (round(v, 4) if isinstance(v, float) else v)
                    for k, v in res.items()
                    if k.startswith(("shape", "mm", "addmm", "best", "err"))
                }
            ),
            flush=True,
        )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gemm_variants.json"), "w") as f:
        json.dump(
            {
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "triton": triton.__version__,
                "command": "PYTHONPATH=. python benchmarks/experiments/gemm_variants.py " + " ".join(sys.argv[1:]),
                "rows": rows,
            },
            f,
            indent=1,
        )
    names = [
        "mm",
        "addmm",
        "addmm_gelu_lt",
        "best_kfuse",
        "best_kfuse_persistent",
        "best_tma",
        "best_tma_persistent",
        "best_tma_persistent_flat",
    ]
    print("shape              " + " ".join(f"{x[:14]:>14s}" for x in names))
    for r in rows:
        print(f"{r['shape']:18s} " + " ".join(f"{r.get(x, float('nan')):14.4f}" for x in names))


if __name__ == "__main__":
    main()
