"""Issue 3 exploration on the GPU: does the tuner's timing method pick the wrong GEMM configs?

Session 6 saw `gemm_bench`'s fast-tuned template at 1.18-2.15x the bare cuBLAS GEMM, while the
best configs of `gemm_ws_probe.py` on the same shapes ran at 1.17-1.68x (BERT T4096 qkv: the
tuner's 256x128 config ~0.057 ms, the probe's 64x256 one 0.0365 ms). The tuner times single
launches with the L2 flushed between repeats; the benches and a compiled model replay CUDA
graphs with a warm L2 (a BERT GEMM's operands, 6-20 MB, fit in the H200's 50 MB L2).

For each BERT / GPT-2 GEMM + bias + GELU shape this tunes twice from empty databases, fast
mode, once with the tuner's default profiler (L2 flushed) and once without the flush, then
times both choices, the rule ranking's first config and cuBLAS alone the way the benches do
(20 calls per CUDA graph, ms per call), checking every output against eager PyTorch.

    PYTHONPATH=. python benchmarks/experiments/tuner_timing_probe.py --out $OUT     # H200, ~120 s
    PYTHONPATH=. python benchmarks/experiments/tuner_timing_probe.py --out /tmp/x --smoke  # CPU wiring
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ["KFUSE_SHIPPED_RECORDS"] = "0"  # the probe tunes from empty databases (kfuse.tune.shipped)

import torch
import torch.nn.functional as F

from kfuse.bench.harness import graph_ms_per_call, max_rel_err, write_experiment
from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import GemmConfig, gemm_epilogue
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import query
from kfuse.tune.profiler import Profiler
from kfuse.tune.space import GemmProblem, rank_by_rules, valid_configs
from kfuse.tune.tuner import Tuner

EPI = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
SHAPES = [  # (case, M, N, K): BERT-base at 4096 / 16384 tokens, GPT-2 small at 8192
    *[(f"bert_T{t}_{name}", t, n, k) for t in (4096, 16384) for name, (k, n) in
      {"qkv": (768, 2304), "attn_out": (768, 768), "ffn1": (768, 3072), "ffn2": (3072, 768)}.items()],
    *[(f"gpt2_T8192_{name}", 8192, n, k) for name, (k, n) in
      {"qkv": (768, 2304), "attn_out": (768, 768), "ffn1": (768, 3072), "ffn2": (3072, 768)}.items()],
]  # fmt: skip
SMOKE_SHAPES = [("smoke_a", 48, 40, 32), ("smoke_b", 33, 24, 48)]


def _choose(problem: GemmProblem, flush: bool, db_dir: str, device: str, smoke: bool) -> tuple[GemmConfig | None, float, int]:
    """The fast tuner's choice from an empty database, with or without the L2 flush."""
    db = TuningDB(Path(db_dir) / f"flush{int(flush)}.sqlite")
    tuner = Tuner("fast", db=db, device=device, profiler=Profiler(flush_l2=flush, check=True), progress=False)
    t0 = time.perf_counter()
    cfg = tuner.choose([(problem, EPI)])[problem.signature()]
    return cfg, time.perf_counter() - t0, tuner.stats.measured  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter): wiring only")
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    dtype = torch.float32 if a.smoke else torch.float16
    hw = query(device)
    recs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as db_dir:
        for case, m, n, k in SMOKE_SHAPES if a.smoke else SHAPES:
            torch.manual_seed(0)
            x = torch.randn(m, k, device=device, dtype=dtype)
            w = (torch.randn(k, n, device=device) / k**0.5).to(dtype)
            bias = torch.randn(n, device=device, dtype=dtype)
            ref = F.gelu(x.float() @ w.float() + bias.float())
            problem = GemmProblem(m, n, k, 1, "fp16" if dtype == torch.float16 else "fp32", n_extras=1)
            rule_first = rank_by_rules(valid_configs(problem, hw), problem, hw)[0]
            rec: dict[str, Any] = {"case": case, "m": m, "n": n, "k": k, "configs": {}}
            mm_out = torch.empty(m, n, device=device, dtype=dtype)
            rec["cublas_ms"] = graph_ms_per_call(lambda: torch.mm(x, w, out=mm_out), (), calls=20)[0]
            chosen: dict[str, GemmConfig | None] = {"rules_first": rule_first}  # type: ignore[dict-item]
            for flush in (True, False):
                cfg, tune_s, measured = _choose(problem, flush, db_dir, device, a.smoke)
                chosen[f"tuner_flush{int(flush)}"] = cfg
                rec[f"tune_s_flush{int(flush)}"], rec[f"measured_flush{int(flush)}"] = round(tune_s, 2), measured
            for label, cfg in chosen.items():
                out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
                try:
                    ms, _ = graph_ms_per_call(lambda cfg=cfg, out=out: gemm_epilogue(x, w, [bias], EPI, dtype, cfg, out=out), (), calls=20)
                    rec["configs"][label] = {"config": cfg.describe() if cfg else "default", "ms": ms, "max_rel_err": max_rel_err(out, ref)}
                except Exception as e:  # noqa: BLE001 - one failing config is a result, not the end of the run
                    rec["configs"][label] = {"config": cfg.describe() if cfg else "default", "error": f"{type(e).__name__}: {str(e)[:160]}"}
            recs.append(rec)
            row = "  ".join(f"{lb} {v.get('ms', float('nan')):.4f} ({v['config']})" for lb, v in rec["configs"].items())
            print(f"{case:22s} cuBLAS {rec['cublas_ms']:.4f}  {row}", flush=True)
    write_experiment("tuner_timing_probe", a.out, timing="20 calls per CUDA graph, ms per call", records=recs)
    print(f"\n{'case':22s} {'cuBLAS':>8s} {'flush on':>9s} {'flush off':>9s} {'rules #1':>9s}")
    for r in recs:
        c = r["configs"]
        cells = [c.get(k, {}).get("ms", float("nan")) for k in ("tuner_flush1", "tuner_flush0", "rules_first")]
        print(f"{r['case']:22s} {r['cublas_ms']:8.4f} " + " ".join(f"{v:9.4f}" for v in cells))


if __name__ == "__main__":
    main()
