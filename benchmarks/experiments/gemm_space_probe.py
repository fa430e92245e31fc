"""Issue 3 / 5 exploration on the GPU: how fast can the GEMM template's space run a shape, and
does the fast tuner find it? For the unfused 256-wide b2b chains (M x 256 x 256 GEMMs + bias +
ReLU, M = 262144 and 1M) the two GEMMs run at ~0.086 ms each at M = 262144, ~72% of the memory
bandwidth (floor: 268 MB / 4.3 TB/s = 0.062 ms a GEMM); the chain sits at 1.96-2.02x its floor.

Times, 20 calls per CUDA graph (ms per call), every output checked against eager PyTorch:
the first ``--top`` valid configs of the rule ranking (persistent TMA ones first among equals),
the fast tuner's choice from an empty database, and cuBLAS ``mm`` alone. Candidates compile in
parallel threads first; anything past ``--budget-s`` is recorded as skipped.

    PYTHONPATH=. python benchmarks/experiments/gemm_space_probe.py --out $OUT     # H200, ~150 s
    PYTHONPATH=. python benchmarks/experiments/gemm_space_probe.py --out /tmp/x --smoke  # CPU wiring
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

from kfuse.bench.harness import graph_ms_per_call, max_rel_err, sweep_configs, write_experiment
from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import GemmConfig, gemm_epilogue, launch, prepare
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import query
from kfuse.tune.profiler import Profiler
from kfuse.tune.space import GemmProblem, rank_by_rules, valid_configs
from kfuse.tune.tuner import Tuner

EPI = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)


def _tma_tile(c: GemmConfig) -> bool:
    """The part of the space a memory-bound GEMM with N = 256 is expected to run best in."""
    tiles = c.block_m in (64, 128, 256) and c.block_n in (128, 256) and c.block_k in (64, 128)
    return tiles and c.split_k == 1 and c.tma and c.group_m == 8 and not c.epilogue_subtile and (not c.persistent or c.flatten)


def _unfused_plan(m: int, k: int, n: int) -> dict[str, Any]:
    """What kfuse compiles Linear(k, n) -> ReLU -> Linear(n, n) into with b2b fusion off and fast
    tuning (the unfused plan of b2b_bench's chain), and its time (20 calls per graph)."""
    import kfuse

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.ReLU(), torch.nn.Linear(n, n)).cuda().half().eval()
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    c = kfuse.compile(model, (x,), cuda_graphs=False, fuse_b2b=False, tune="fast")
    with torch.no_grad():
        ms, y = graph_ms_per_call(c, (x,), calls=20)
        err = max_rel_err(y, model(x))
    kernels = c.report["kernels"]
    desc = "; ".join(f"{kk['template']} {kk.get('config', '')}" for kk in kernels)
    print(f"unfused plan M{m} {k}x{n}x{n}: {ms:.4f} ms; {desc}", flush=True)
    return {"case": f"unfused_plan_M{m}_{k}x{n}x{n}", "ms": ms, "max_rel_err": err, "kernels": kernels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="262144x256x256,1048576x256x256", help="MxNxK list")
    ap.add_argument("--top", type=int, default=90, help="rule-ranked configs timed per shape")
    ap.add_argument(
        "--tma-tiles", action="store_true", help="only TMA configs, 64-256 x 128-256 tiles, K steps 64-128, flattened if persistent"
    )
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter): wiring only")
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    dtype = torch.float32 if a.smoke else torch.float16
    shapes = [(40, 24, 32)] if a.smoke else [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    top = 3 if a.smoke else a.top
    hw = query(device)
    t_end = time.perf_counter() + a.budget_s
    recs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as db_dir:
        for i, (m, n, k) in enumerate(shapes):
            deadline = time.perf_counter() + (t_end - time.perf_counter()) / (len(shapes) - i)
            torch.manual_seed(0)
            x = torch.randn(m, k, device=device, dtype=dtype)
            w = (torch.randn(k, n, device=device) / k**0.5).to(dtype)
            bias = torch.randn(n, device=device, dtype=dtype)
            ref = F.relu(x.float() @ w.float() + bias.float())
            problem = GemmProblem(m, n, k, 1, "fp16" if dtype == torch.float16 else "fp32", n_extras=1)
            ranked = rank_by_rules(valid_configs(problem, hw), problem, hw)
            if a.tma_tiles and not a.smoke:
                ranked = [c for c in ranked if _tma_tile(c)]
            tuner = Tuner("fast", db=TuningDB(Path(db_dir) / f"t{i}.sqlite"), device=device, profiler=Profiler(check=True), progress=False)
            t0 = time.perf_counter()
            chosen = tuner.choose([(problem, EPI)])[problem.signature()]
            rec: dict[str, Any] = {"case": f"M{m}_N{n}_K{k}", "m": m, "n": n, "k": k, "tune_s": round(time.perf_counter() - t0, 2)}
            rec["tuner_choice"] = chosen.describe() if chosen else "default"
            mm_out = torch.empty(m, n, device=device, dtype=dtype)
            rec["cublas_mm_ms"] = graph_ms_per_call(lambda: torch.mm(x, w, out=mm_out), (), calls=20)[0]
            # the library candidates kfuse's lowering times against the template (gemm_library):
            # cuBLASLt with the bias (and ReLU) in its epilogue
            if not a.smoke:
                for name, fn in (("cublaslt_addmm_ms", lambda: torch.addmm(bias, x, w)),
                                 ("cublaslt_addmm_relu_ms", lambda: torch._addmm_activation(bias, x, w))):  # fmt: skip
                    ms, y = graph_ms_per_call(fn, (), calls=20)
                    rec[name] = ms
                    rec[name.replace("_ms", "_max_rel_err")] = max_rel_err(y if "relu" in name else torch.relu(y), ref)
            cfgs: list[GemmConfig] = ([chosen] if chosen else []) + [c for c in ranked[:top] if c != chosen]  # type: ignore[misc]

            def time_one(cfg: GemmConfig, m: int = m, n: int = n) -> dict[str, Any]:
                out = torch.full((m, n), float("nan"), device=device, dtype=dtype)
                ms, _ = graph_ms_per_call(lambda: gemm_epilogue(x, w, [bias], EPI, dtype, cfg, out=out), (), calls=20)
                return {"ms": ms, "max_rel_err": max_rel_err(out, ref)}

            def compile_one(cfg: GemmConfig) -> None:
                launch(prepare(x, w, [bias], dtype, None), EPI, cfg, warmup=True)

            res = sweep_configs(cfgs, None if a.smoke else compile_one, time_one, deadline)
            rec["configs"] = res
            ok = sorted((v["ms"], c) for c, v in res.items() if isinstance(v, dict) and v["max_rel_err"] < 2e-2)
            rec["best"] = ok[:5]
            recs.append(rec)
            got = res.get(rec["tuner_choice"])
            choice_ms = got["ms"] if isinstance(got, dict) else float("nan")
            lt = {k: round(v, 4) for k, v in rec.items() if k.startswith("cublaslt") and k.endswith("_ms")}
            print(
                f"{rec['case']}: cuBLAS mm {rec['cublas_mm_ms']:.4f} {lt}; tuner {rec['tuner_choice']} {choice_ms:.4f}; best {ok[:3]}",
                flush=True,
            )
    if not a.smoke:
        recs += [_unfused_plan(m, k, n) for m, n, k in shapes if n == k]
    write_experiment("gemm_space_probe", a.out, timing="20 calls per CUDA graph, ms per call", records=recs)


if __name__ == "__main__":
    main()
