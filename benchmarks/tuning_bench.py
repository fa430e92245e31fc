"""Tuning cost and quality: all GEMMs of bert-base (B=32, S=128) and all convs of resnet50 (B=64)
tuned from an empty database by ``kfuse.compile(..., tune="fast")``; a second compile with the
warm database; and the gap between the tuner's choice and exhaustive search of the same space
on a subset (one GEMM and one conv problem, a 48-config sub-space each, the GEMM's plus 12 configs
of the warp-specialised kernels: exhaustive search of the full space would take minutes of compiles).

Targets: cold tuning <= 60 s per model, warm compile <= 5 s, gap <= 3%.
(Reference points on this H200: max-autotune compiles bert-base in 138 s, resnet50 in 300 s.)

    PYTHONPATH=. python benchmarks/tuning_bench.py --out $OUT            # GPU, <= 150 s
    PYTHONPATH=. python benchmarks/tuning_bench.py --out /tmp/x --smoke  # CPU wiring check (fake timing)
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# cold tuning is measured from an empty database: nothing seeded from kfuse's shipped records (kfuse.tune.shipped)
os.environ["KFUSE_SHIPPED_RECORDS"] = "0"

import torch

import kfuse
import kfuse.models as zoo
import kfuse.tune.tuner as tuner_mod
from kfuse.bench.harness import make_record, write_results
from kfuse.kernels.conv import ConvConfig
from kfuse.kernels.gemm import GemmConfig
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import DEFAULT
from kfuse.tune.profiler import Profiler
from kfuse.tune.search import exhaustive
from kfuse.tune.space import ConvProblem, GemmProblem, estimate_ms

MODELS = {"bert-base": {"batch": 32, "seq": 128}, "resnet50": {"batch": 64}}
SMOKE_MODELS = {"bert-tiny": {"batch": 2, "seq": 8}, "resnet-tiny": {"batch": 1}}


def sub_space(template: str) -> list:
    if template == "gemm":
        axes = itertools.product((64, 128), (64, 128, 256), (32, 64), (4, 8), (3, 4))
        plain = [GemmConfig(bm, bn, bk, 8, w, s) for bm, bn, bk, w, s in axes]
        # and the warp-specialised Gluon kernels (session 18): the tiles and stages that won in its probes
        ws = [
            GemmConfig(bm, bn, 64, 8, 4, s, tma=True, ws="pingpong")
            for (bm, bn), s in itertools.product(((128, 128), (64, 128), (128, 64)), (4, 5, 6))
        ]
        ws += [GemmConfig(128, 256, 64, 8, 8, s, tma=True, ws="coop") for s in (3, 4)] + [
            GemmConfig(128, 128, 64, 8, 8, 6, tma=True, ws="coop")
        ]
        return plain + ws
    return [ConvConfig(bm, bn, bk, 8, w, s) for bm, bn, bk, w, s in itertools.product((64, 128), (64, 128), (32, 64), (4, 8), (2, 3, 4))]


def _fake(cfg, problem) -> float:  # smoke only: the analytic estimate stands in for the GPU
    return estimate_ms(cfg, problem, DEFAULT)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/h200")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--mode", default="fast", choices=["fast", "full"])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--no-gap", action="store_true", help="skip the comparison with exhaustive search")
    p.add_argument("--fresh-triton-cache", action="store_true",
                   help="compile every kernel from scratch (an empty TRITON_CACHE_DIR), as on a fresh machine; "
                        "without it Triton's cache is used as found")  # fmt: skip
    args = p.parse_args()
    if unknown := [m for m in args.models.split(",") if m not in MODELS]:
        p.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(MODELS)})")
    command = "PYTHONPATH=. python benchmarks/tuning_bench.py " + " ".join(sys.argv[1:])
    t_start = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.float16 if dev == "cuda" else torch.float32
    tmp = tempfile.mkdtemp(prefix="kfuse_tune_")
    os.environ["KFUSE_TUNE_DB"] = os.path.join(tmp, "tune.sqlite")  # an empty database
    if args.fresh_triton_cache:  # read by Triton at each compile: set before the first one
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
    triton_cache = "fresh" if args.fresh_triton_cache else "as found"
    if args.smoke:
        orig = tuner_mod.Tuner

        class SmokeTuner(orig):
            def __init__(self, mode: str, **kw: object) -> None:
                super().__init__(mode, measure=_fake, hw=DEFAULT, check=False, **kw)  # type: ignore[arg-type]

        tuner_mod.Tuner = SmokeTuner  # type: ignore[misc]

    # ---- cold and warm compiles of whole models ------------------------------------------
    records = []
    models = SMOKE_MODELS if args.smoke else {m: MODELS[m] for m in args.models.split(",")}
    for name, kw in models.items():
        try:
            model, margs, mkw = zoo.build(name, dtype=dtype, device=dev, **kw)
            t0 = time.perf_counter()
            kfuse.compile(model, margs, mkw, tune=args.mode, check=False)
            cold_total = time.perf_counter() - t0
            st = tuner_mod.LAST[0].stats
            t0 = time.perf_counter()
            kfuse.compile(model, margs, mkw, tune=args.mode, check=False)
            warm_s = time.perf_counter() - t0
            st2 = tuner_mod.LAST[0].stats
            rec = make_record(
                "tuning", f"{name}_{args.mode}", None, {}, None, None, command,
                dtype="fp16" if dtype == torch.float16 else "fp32",
                cold_s=round(st.seconds, 2), cold_compile_s=round(cold_total, 2), warm_s=round(warm_s, 2),
                warm_tune_s=round(st2.seconds, 3), warm_measured=st2.measured,
                problems=st.problems, candidates_considered=st.considered, candidates_measured=st.measured, failed=st.failed,
                triton_cache=triton_cache,
                slowest_problems_s=sorted(st.problem_s.items(), key=lambda kv: -kv[1])[:6],
                reference_max_autotune_compile_s={"bert-base": 138, "resnet50": 300}.get(name),
            )  # fmt: skip
            records.append(rec)
            print(f"{name}: {st.line(args.mode)}; cold compile {cold_total:.1f} s, warm compile {warm_s:.1f} s")
        except Exception as e:  # noqa: BLE001
            print(f"{name} failed: {type(e).__name__}: {str(e)[:300]}")
    # ---- the gap vs exhaustive search, on one problem per template -----------------------
    # after the models, so that their cold compiles find none of its kernels in Triton's caches
    gaps: dict[str, dict] = {}
    subset = {"gemm": GemmProblem(4096, 3072, 768, n_extras=1), "conv": ConvProblem(64, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1))}
    if args.smoke:
        subset = {"gemm": GemmProblem(512, 384, 256, n_extras=1), "conv": ConvProblem(4, 64, 16, 16, 64, 3, 3, (1, 1), (1, 1))}
    for tmpl, prob in ({} if args.no_gap else subset).items():
        try:
            space = sub_space(tmpl)
            t = tuner_mod.Tuner(args.mode, db=TuningDB(":memory:"), progress=False)
            t0 = time.perf_counter()
            chosen = t.tune(prob, space=space)
            tuned_s = time.perf_counter() - t0
            prof = Profiler(measure=_fake) if args.smoke else Profiler()
            runner = None if args.smoke else tuner_mod.make_runner(prob, dev)
            t0 = time.perf_counter()
            ex = exhaustive(prob, t.hw, prof, runner, space=space)
            ex_s = time.perf_counter() - t0
            times = {m.config: m.time_ms for m in ex.measured if m.ok}
            gap = times[chosen.best] / ex.best_ms - 1 if chosen.best in times and ex.best_ms else None
            gaps[tmpl] = {"problem": prob.signature(), "gap": gap, "space": len(ex.measured), "tuner_measured": chosen.n_measured,
                          "tuner_s": round(tuned_s, 1), "exhaustive_s": round(ex_s, 1),
                          "chosen": chosen.best.describe() if chosen.best else None,
                          "best": ex.best.describe() if ex.best else None}  # fmt: skip
            print(f"gap vs exhaustive [{tmpl}] {prob.signature()}: {gaps[tmpl]}")
        except Exception as e:  # noqa: BLE001
            print(f"gap vs exhaustive [{tmpl}] failed: {type(e).__name__}: {str(e)[:300]}")

    for rec in records:
        g = gaps.get("conv" if "resnet" in rec["case"] else "gemm", {})
        rec.update(gap_vs_exhaustive=g.get("gap"), gap_detail=g)
    path = write_results("tuning", records, args.out)
    print(f"\nwrote {path} ({time.perf_counter() - t_start:.0f} s)")
    print(f"{'model':16s} {'problems':>8s} {'measured':>8s} {'cold_s':>7s} {'warm_s':>7s} {'gap':>7s}")
    for r in records:
        gap = r["gap_vs_exhaustive"]
        print(f"{r['case']:16s} {r['problems']:8d} {r['candidates_measured']:8d} {r['cold_s']:7.1f} {r['warm_s']:7.1f} "
              f"{'-' if gap is None else f'{100 * gap:6.1f}%':>7s}")  # fmt: skip
    print("targets: cold <= 60 s per model, warm <= 5 s, gap <= 3%")


if __name__ == "__main__":
    main()
