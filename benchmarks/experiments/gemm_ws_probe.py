"""Probe: does the persistent TMA kernel (``gemm_tma_persistent_kernel``: flattened tile loop, warp
specialisation, subtiled epilogue) close the template's gap to cuBLAS at BERT/GPT-2 shapes?

12 shapes: BERT at 4096 and 16384 tokens, GPT-2 at 8192 tokens, each with (N, K) = qkv (2304, 768),
attn_out (768, 768), ffn1 (3072, 768), ffn2 (768, 3072). fp16; A (M, K) row-major; B (K, N) is
``W.t()`` of an nn.Linear weight W (N, K), i.e. column-major, as in a real model. Timed per shape:

* cuBLAS ``torch.matmul`` alone, cuBLAS + bias + GELU(tanh) in eager (``F.linear`` then ``F.gelu``),
  and cuBLASLt's fused bias+GELU (``torch._addmm_activation``) for reference;
* ``gemm_tma_kernel`` (one program per tile) with a few good configs;
* ``gemm_tma_persistent_kernel`` over a small grid (tiles x warps x stages x hints).

Every kfuse candidate runs the generated bias + GELU(tanh) epilogue and is checked against torch
(max relative error) in the same run. Candidates the tuner's hard rules reject on this GPU are
recorded with the reason and not run (``--include-rejected`` runs them). Timing: 20 back-to-back
calls captured in one CUDA graph, CUDA events around each replay, median of 20 replays / 20 (ms
per call), L2 not flushed. All candidates compile first, in parallel (Triton's async-compile
mode); a failure or a wrong result of one is recorded, never fatal. Writes ``gemm_ws_probe.json``
(after every shape) and prints a table last.

    PYTHONPATH=. python benchmarks/experiments/gemm_ws_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.getcwd())
from kfuse.ir import ops  # noqa: E402,F401 - registers the ops the epilogue references
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand  # noqa: E402
from kfuse.kernels.gemm import GemmCall, GemmConfig, launch, prepare  # noqa: E402
from kfuse.tune.hardware import query  # noqa: E402
from kfuse.tune.space import GemmProblem, hard_reject  # noqa: E402

EPI = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu_tanh", (Operand("reg", 1),))), 1)
NK = {"qkv": (2304, 768), "attn_out": (768, 768), "ffn1": (3072, 768), "ffn2": (768, 3072)}
SHAPES = [
    (f"{model} {name}", tokens, n, k) for model, tokens in (("bert", 4096), ("bert", 16384), ("gpt2", 8192)) for name, (n, k) in NK.items()
]
TOL = 1e-2  # max |out - ref| / max |ref|, fp16 output


def _old(bm: int, bn: int, bk: int, w: int, s: int) -> GemmConfig:
    return GemmConfig(bm, bn, bk, 8, w, s, tma=True)


def _new(bm: int, bn: int, bk: int, w: int, s: int, **hints: bool) -> GemmConfig:
    return GemmConfig(bm, bn, bk, 8, w, s, persistent=True, tma=True, **hints)


OLD = [_old(128, 256, 64, 8, 4), _old(128, 128, 64, 8, 4), _old(64, 256, 64, 4, 5)]
TILES = ((128, 128), (128, 256), (64, 256))
NEW = (
    [_new(bm, bn, 64, w, s, flatten=True) for bm, bn in TILES for w in (4, 8) for s in (3, 4)]
    + [_new(128, 256, 64, 8, 3, flatten=True, epilogue_subtile=True), _new(64, 256, 64, 4, 3, flatten=True, epilogue_subtile=True)]
    # Triton 3.6 specialises warps on sm_90 only with num_warps=4 and an unflattened loop, and the
    # result deadlocks with BLOCK_M > 64 (never run: it would hang the probe) and does not compile
    # at 64x256, so the warp-specialised candidates are 64-row tiles
    + [_new(64, bn, 64, 4, s, warp_specialize=True) for bn in (64, 128) for s in (3, 4)]
    + [_new(128, 128, 64, 8, 4), _new(128, 256, 64, 8, 4)]  # no hint: what flatten / ws add on top
)


def graph_ms(fn: Callable[[], Any], inner: int = 20, reps: int = 20) -> float:
    """Median ms per call: ``inner`` calls captured in one CUDA graph, ``reps`` timed replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / inner)
    del g
    return statistics.median(times)


def _short(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {(lines[-1] if lines else '')[:300]}"


def _kind(cfg: GemmConfig) -> str:
    return "tma_persistent" if cfg.persistent else "tma"


def compile_all(g: GemmCall, cfgs: list[GemmConfig], workers: int) -> tuple[dict[str, str], float]:
    """Compile every candidate in parallel (``launch(warmup=True)`` under Triton's async-compile
    mode). A compile that fails there fails again at its first run, where it is recorded."""
    t0 = time.perf_counter()
    errors: dict[str, str] = {}
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        AsyncCompileMode = None  # noqa: N806
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ctx = AsyncCompileMode(pool, ignore_errors=True) if AsyncCompileMode is not None else contextlib.nullcontext()
        with ctx:
            for cfg in cfgs:
                try:
                    launch(g, EPI, cfg, warmup=True)
                except Exception as e:  # noqa: BLE001 - recorded, never fatal
                    errors[cfg.describe()] = _short(e)
    return errors, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=80.0, help="stop timing new candidates after this many seconds")
    ap.add_argument("--include-rejected", action="store_true", help="also run configs the tuner's hard rules reject")
    args = ap.parse_args()
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "gemm_ws_probe.json")
    hw = query()
    dev = torch.device("cuda")
    doc: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "num_sms": hw.num_sms,
        "command": "PYTHONPATH=. python benchmarks/experiments/gemm_ws_probe.py " + " ".join(sys.argv[1:]),
        "timing": "20 calls in one CUDA graph, median of 20 replays / 20, ms per call, L2 not flushed",
        "epilogue": EPI.describe(),
        "tol_rel": TOL,
        "shapes": [],
    }

    def save() -> None:
        doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        with open(out_path, "w") as f:
            json.dump(doc, f, indent=1)

    cands = OLD + NEW
    # compile with the first shape's operands: every shape gives the same specialisation (sizes
    # and strides are multiples of 16, NUM_PROGRAMS = #SMs wherever the rules allow the kernel)
    torch.manual_seed(0)
    _, m0, n0, k0 = SHAPES[0]
    a0 = torch.randn(m0, k0, device=dev, dtype=torch.float16)
    w0 = torch.randn(n0, k0, device=dev, dtype=torch.float16)
    g0 = prepare(a0, w0.t(), [torch.randn(n0, device=dev, dtype=torch.float16)], torch.float16)
    p0 = GemmProblem(m0, n0, k0, b_t=True, n_extras=1)
    to_compile = [c for c in cands if args.include_rejected or hard_reject(c, p0, hw) is None]
    compile_errors, compile_s = compile_all(g0, to_compile, min(16, os.cpu_count() or 4))
    doc["compile"] = {"configs": len(to_compile), "seconds": round(compile_s, 1), "errors": compile_errors}
    print(f"compiled {len(to_compile)} configs in {compile_s:.1f} s ({len(compile_errors)} errors)", flush=True)
    del a0, w0, g0
    broken: dict[str, str] = {}  # config -> error, once a config failed to build or launch
    for label, m, n, k in SHAPES:
        torch.manual_seed(0)
        a = torch.randn(m, k, device=dev, dtype=torch.float16)
        w = torch.randn(n, k, device=dev, dtype=torch.float16) / math.sqrt(k)  # nn.Linear weight (N, K)
        bias = torch.randn(n, device=dev, dtype=torch.float16)
        b = w.t()  # (K, N), column-major
        ref = F.gelu(a.float() @ b.float() + bias.float(), approximate="tanh")
        out = torch.empty(m, n, device=dev, dtype=torch.float16)
        flops = 2.0 * m * n * k
        row: dict[str, Any] = {"label": label, "m": m, "n": n, "k": k, "gflop": flops / 1e9, "baselines": {}, "candidates": []}
        baselines = {
            "cublas_mm": lambda: torch.matmul(a, b),
            "cublas_bias_gelu_eager": lambda: F.gelu(F.linear(a, w, bias), approximate="tanh"),
            "cublaslt_addmm_gelu": lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
        }
        for name, fn in baselines.items():
            try:
                ms = graph_ms(fn)
                row["baselines"][name] = {"ms": ms, "tflops": flops / ms / 1e9}
            except Exception as e:  # noqa: BLE001
                row["baselines"][name] = {"error": _short(e)}
        prob = GemmProblem(m, n, k, b_t=True, n_extras=1)
        g = prepare(a, b, [bias], torch.float16, out=out)
        for cfg in cands:
            rec: dict[str, Any] = {"kernel": _kind(cfg), "config": cfg.describe(), "config_dict": cfg.as_dict()}
            row["candidates"].append(rec)
            why = hard_reject(cfg, prob, hw)
            if why is not None and not args.include_rejected:
                rec.update(status="rejected", error=why)
                continue
            if cfg.describe() in broken:
                rec.update(status="failed", error=broken[cfg.describe()])
                continue
            if time.perf_counter() - t_start > args.budget_s:
                rec.update(status="skipped", error=f"time budget {args.budget_s} s spent")
                continue
            try:
                out.fill_(float("nan"))  # poisoned: every element must be written
                launch(g, EPI, cfg)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a config that cannot build or launch is recorded
                broken[cfg.describe()] = _short(e)
                rec.update(status="failed", error=broken[cfg.describe()])
                continue
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            rec["rel_err"] = err
            if not err < TOL:
                rec.update(status="wrong")
                continue
            try:
                ms = graph_ms(lambda cfg=cfg: launch(g, EPI, cfg))
                rec.update(status="ok", ms=ms, tflops=flops / ms / 1e9)
            except Exception as e:  # noqa: BLE001
                rec.update(status="failed", error=_short(e))
        for kind in ("tma", "tma_persistent"):
            ok = [c for c in row["candidates"] if c["kernel"] == kind and c.get("status") == "ok"]
            if ok:
                best = min(ok, key=lambda c: c["ms"])
                row[f"best_{kind}"] = {"ms": best["ms"], "tflops": best["tflops"], "config": best["config"]}
        doc["shapes"].append(row)
        save()
        mm = row["baselines"].get("cublas_mm", {}).get("ms")
        bn = row.get("best_tma_persistent", {})
        print(f"{label:15s} {m}x{n}x{k}: cuBLAS {mm} ms, best new {bn.get('ms')} ms ({bn.get('config')})", flush=True)
    save()
    _table(doc)


def _table(doc: dict[str, Any]) -> None:
    print()
    print(f"{doc['gpu']}, torch {doc['torch']}, triton {doc['triton']}; ms per call (TFLOP/s); elapsed {doc['elapsed_s']} s")
    head = f"{'shape':15s} {'MxNxK':17s} {'cuBLAS':>15s} {'cuBLAS+b+gelu':>15s} {'old TMA best':>15s} {'config':28s}"
    head += f" {'new best':>15s} {'config':38s} {'new/cuBLAS':>10s}"
    print(head)

    def cell(d: dict[str, Any] | None) -> str:
        return f"{d['ms']:.4f} ({d['tflops']:3.0f})" if d and "ms" in d else "-"

    for r in doc["shapes"]:
        mm = r["baselines"].get("cublas_mm")
        old, new = r.get("best_tma"), r.get("best_tma_persistent")
        ratio = f"{new['ms'] / mm['ms']:.2f}x" if new and mm and "ms" in mm else "-"
        print(
            f"{r['label']:15s} {r['m']}x{r['n']}x{r['k']:<7} {cell(mm):>15s} {cell(r['baselines'].get('cublas_bias_gelu_eager')):>15s}"
            f" {cell(old):>15s} {(old or {}).get('config', '-'):28s} {cell(new):>15s} {(new or {}).get('config', '-'):38s} {ratio:>10s}"
        )
    bad = [(r["label"], c["config"], c["status"], c.get("error", c.get("rel_err"))) for r in doc["shapes"] for c in r["candidates"]]
    bad = [x for x in bad if x[2] in ("failed", "wrong")]
    if bad:
        print(f"{len(bad)} failed/wrong candidate runs, e.g.:", *bad[:6], sep="\n  ")


if __name__ == "__main__":
    main()
