"""GEMM + bias + GELU on the GEMM shapes of BERT-base (tokens 4096, 16384) and GPT-2 small
(tokens 8192; hidden 768/3072), fp16: kfuse's tuned template vs cuBLAS GEMM alone
(``gemm_only``, no epilogue), eager GEMM+bias+GELU, ``torch.compile`` and max-autotune.

Target: kfuse <= gemm_only on >= 80% of the shapes (the epilogue is free, the GEMM at library
speed). Each shape is tuned with ``tune=fast`` from the database at $KFUSE_TUNE_DB (empty on
a fresh machine: tuning time is part of the run and recorded as ``tune_s``).

max-autotune compiles take ~10-30 s per shape: only the first ``--autotune-shapes`` shapes
(default 3) get that baseline, and every baseline is skipped once ``--budget-s`` is spent.

    PYTHONPATH=. python benchmarks/gemm_bench.py --out $OUT            # GPU, <= 150 s
    PYTHONPATH=. python benchmarks/gemm_bench.py --out /tmp/x --smoke  # CPU wiring check
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

from kfuse.bench.harness import (
    floor_ms,
    graph_or_plain,
    interleaved_ms_rounds,
    make_record,
    max_rel_err,
    paired_ratio_band,
    pytorch_baselines,
    round_medians,
    time_ms,
    write_results,
)
from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import gemm_epilogue
from kfuse.kernels.gemm_library import gemm_library, split_epilogue

EPI = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
LAYERS = {"qkv": (768, 2304), "attn_out": (768, 768), "ffn1": (768, 3072), "ffn2": (3072, 768)}  # (K, N)
MODELS = {"bert": (4096, 16384), "gpt2": (8192,)}


def shapes(smoke: bool) -> list[tuple[str, int, int, int]]:
    if smoke:
        return [("smoke_ffn1", 64, 48, 40), ("smoke_ffn2", 33, 40, 96)]
    out = []
    for model, toks in MODELS.items():
        for t in toks:
            for name, (k, n) in LAYERS.items():
                out.append((f"{model}_T{t}_{name}", t, n, k))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/h200")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--tune", default="fast", choices=["none", "fast", "full"])
    p.add_argument("--autotune-shapes", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=140.0)
    args = p.parse_args()
    command = "PYTHONPATH=. python benchmarks/gemm_bench.py " + " ".join(sys.argv[1:])
    t_start = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.float16 if dev == "cuda" else torch.float32
    tuner = None
    if args.tune != "none" and dev == "cuda":
        from kfuse.tune.tuner import Tuner

        tuner = Tuner(args.tune, progress=False)
    records, rows = [], []
    for i, (case, m, n, k) in enumerate(shapes(args.smoke)):
        try:
            print(f"{case}: M={m} N={n} K={k}")
            a = torch.randn(m, k, device=dev, dtype=dtype)
            w = (torch.randn(n, k, device=dev) / k**0.5).to(dtype)  # nn.Linear layout
            bias = torch.randn(n, device=dev, dtype=dtype)
            b = w.t().contiguous()  # kfuse folds the weight transpose at compile time

            def eager(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
                return F.gelu(F.linear(a, w, bias))

            spent = time.perf_counter() - t_start
            which = ["eager", "eager_cudagraph"]
            if not args.smoke and spent < args.budget_s * 0.6:
                which.append("compile")
            if not args.smoke and i < args.autotune_shapes and spent < args.budget_s * 0.5:
                which.append("max_autotune")
            base, outs, compile_s = pytorch_baselines(eager, (a, w, bias), which=which, rep=20 if args.smoke else 50)
            mm_out = torch.empty((m, n), device=dev, dtype=dtype)
            cfg, tune_s, measured = None, 0.0, 0
            if tuner is not None:
                from kfuse.tune.space import GemmProblem

                t0 = time.perf_counter()
                before = tuner.stats.measured
                prob = GemmProblem(m, n, k, 1, "fp16", n_extras=1)
                cfg = tuner.choose([(prob, EPI)])[prob.signature()]
                tune_s, measured = time.perf_counter() - t0, tuner.stats.measured - before
            out = torch.full((m, n), float("nan"), device=dev, dtype=dtype)
            gemm_epilogue(a, b, [bias], EPI, dtype, cfg, out=out)
            ref = outs.get("eager")
            err = max_rel_err(out, ref)
            kf_events = time_ms(lambda: gemm_epilogue(a, b, [bias], EPI, dtype, cfg, out=out), rep=20 if args.smoke else 50)
            # the same config with the erf GELU everywhere (KFUSE_EXACT_GELU=1): what the tanh form saves
            os.environ["KFUSE_EXACT_GELU"] = "1"
            try:
                exact_out = torch.full((m, n), float("nan"), device=dev, dtype=dtype)
                gemm_epilogue(a, b, [bias], EPI, dtype, cfg, out=exact_out)
                exact_err = max_rel_err(exact_out, ref)
                kf_exact = time_ms(graph_or_plain(lambda: gemm_epilogue(a, b, [bias], EPI, dtype, cfg, out=exact_out)),
                                   rep=20 if args.smoke else 50)  # fmt: skip
            finally:
                os.environ.pop("KFUSE_EXACT_GELU")
            print(f"  {'kfuse exact gelu':16s} {kf_exact:9.4f} ms  err {exact_err:.1e}")
            # the other candidate kfuse's lowering measures: cuBLAS(Lt) + the rest of the epilogue
            split = split_epilogue(EPI, batched=False)
            lib_out = gemm_library(a, b, [bias], EPI, split, dtype)
            lib_err = max_rel_err(lib_out, ref)
            # the three kernel times the target compares, interleaved in rotated rounds (the H200
            # clocks down under sustained GEMM load: whichever side is timed last would pay for it),
            # each replayed from a CUDA graph as kfuse runs them inside a model: one call a replay
            # (the record; the graph's launch is in it for every side), and the steady state, 20 calls
            # a graph (the launch's fixed cost spread, as for a call inside a captured model)
            out_f32gelu = torch.full((m, n), float("nan"), device=dev, dtype=dtype)

            def kfuse_f32gelu() -> None:
                # the same config with the GELU in fp32 (KFUSE_GELU16=0, sessions 18-28's form); the
                # Gluon kernels read the setting at launch, so the captured graph keeps that module
                os.environ["KFUSE_GELU16"] = "0"
                try:
                    gemm_epilogue(a, b, [bias], EPI, dtype, cfg, out=out_f32gelu)
                finally:
                    os.environ.pop("KFUSE_GELU16")

            sides = {
                "kfuse": lambda: gemm_epilogue(a, b, [bias], EPI, dtype, cfg, out=out),
                "gemm_only": lambda: torch.mm(a, b, out=mm_out),
                "library": lambda: gemm_library(a, b, [bias], EPI, split, dtype),
                "kfuse_f32gelu": kfuse_f32gelu,
            }
            rounds = 3 if args.smoke else 9
            single_rounds = interleaved_ms_rounds(sides, rounds=rounds, calls=1, rep=10)
            steady_rounds = interleaved_ms_rounds(sides, rounds=rounds, calls=20, rep=3)
            single, steady = round_medians(single_rounds), round_medians(steady_rounds)
            # kfuse / gemm_only round by round: a tie where the rounds' spread holds parity
            band = paired_ratio_band(single_rounds["kfuse"], single_rounds["gemm_only"])
            steady_band = paired_ratio_band(steady_rounds["kfuse"], steady_rounds["gemm_only"])
            kf, lib, base["gemm_only"] = single["kfuse"], single["library"], single["gemm_only"]
            f32gelu_err = max_rel_err(out_f32gelu, ref)
            print(f"  {'gemm_only':16s} {base['gemm_only']:9.4f} ms")
            print(f"  {'kfuse kernel':16s} {kf:9.4f} ms  config {cfg.describe() if cfg else 'default'}  err {err:.1e}")
            print(f"  {'kfuse library':16s} {lib:9.4f} ms  {split.describe()}  err {lib_err:.1e}")
            print(f"  {'kfuse fp32 gelu':16s} {single['kfuse_f32gelu']:9.4f} ms  err {f32gelu_err:.1e}")
            print("  steady (20/graph) " + "  ".join(f"{who} {ms:.4f}" for who, ms in steady.items()) + " ms")
            flops = 2.0 * m * n * k
            bytes_moved = 2.0 * (m * k + k * n + m * n + n)
            rec = make_record(
                "gemm_epilogue", case, kf, base, floor_ms(flops, bytes_moved), err, command,
                dtype="fp16" if dtype == torch.float16 else "fp32",
                m=m, n=n, k=k, config=cfg.describe() if cfg else "default", tune_s=round(tune_s, 2),
                candidates_measured=measured, compile_s={k2: round(v, 1) for k2, v in compile_s.items()},
                vs_gemm_only=base["gemm_only"] / kf, kfuse_ms_with_launch=kf_events,
                kfuse_library_ms=lib, kfuse_library_err=lib_err, kfuse_choice="library" if lib < kf else "template",
                kfuse_ms_is="kfuse's own kernel with the fused epilogue, tuned (the Triton template or a Gluon warp-specialised "
                            "kernel; the issue's target); kfuse_library_ms is the cuBLAS(Lt) candidate the compiler also measures",
                gelu_form="tanh form (kfuse's default GELU policy, as cuBLASLt's epilogue; the Gluon kernels on f16x2 pairs "
                          "for fp16 outputs since session 29, the Triton template in the erf form)",
                kfuse_exact_gelu_ms=kf_exact, kfuse_exact_gelu_err=exact_err,
                kfuse_f32gelu_ms=single["kfuse_f32gelu"], kfuse_f32gelu_err=f32gelu_err,
                kfuse_f32gelu_is="the same config with the GELU in fp32 on tanh.approx.f32 (KFUSE_GELU16=0; sessions 18-28's form)",
                timing="kfuse, gemm_only and the library path replayed from CUDA graphs, one call a replay, interleaved in "
                       f"{rounds} rotated rounds (median); steady_ms: the same with 20 calls a graph; eager/compile baselines as called",
                steady_ms=steady, steady_vs_gemm_only=steady["gemm_only"] / steady["kfuse"],
                kfuse_over_gemm_only_rounds=band, steady_kfuse_over_gemm_only_rounds=steady_band,
                rounds_are="kfuse / gemm_only time in each rotated round: median, quartiles, verdict -1 (kfuse faster in most rounds), "
                           "0 (the quartiles hold parity: a tie within the rounds' spread), +1 (slower)",
            )  # fmt: skip
            records.append(rec)
            rows.append((case, kf, base, steady, single["kfuse_f32gelu"], band))
        except Exception as e:  # one shape failing must not stop the others
            print(f"  {case} failed: {type(e).__name__}: {str(e)[:300]}")
    path = write_results("gemm_epilogue", records, args.out)
    print(f"\nwrote {path} ({time.perf_counter() - t_start:.0f} s)")
    head = f"{'case':28s} {'kfuse':>8s} {'gemm_only':>9s} {'eager':>8s} {'compile':>8s} {'max_at':>8s}"
    print(head + "  kfuse<=gemm_only  steady: kfuse gemm_only  fp32-gelu kfuse")
    wins = steady_wins = f32_wins = 0
    verdicts = {-1: 0, 0: 0, 1: 0}
    for case, kf, base, steady, f32gelu, band in rows:
        if band is not None:
            verdicts[band["verdict"]] += 1
        ok, steady_ok = kf <= base["gemm_only"], steady["kfuse"] <= steady["gemm_only"]
        wins += ok
        steady_wins += steady_ok
        f32_wins += f32gelu <= base["gemm_only"]
        cells = [f"{base[b]:8.4f}" if b in base else f"{'-':>8s}" for b in ("eager", "compile", "max_autotune")]
        print(f"{case:28s} {kf:8.4f} {base['gemm_only']:9.4f} {' '.join(cells)}  {'yes' if ok else 'no ':16s}"
              f"  {steady['kfuse']:.4f} {steady['gemm_only']:.4f} {'yes' if steady_ok else 'no '}  {f32gelu:.4f}")  # fmt: skip
    if rows:
        print(f"kfuse <= cuBLAS GEMM alone on {wins}/{len(rows)} shapes ({100 * wins / len(rows):.0f}%; target 80%); "
              f"in the steady state (20 calls a graph) on {steady_wins}/{len(rows)}; "
              f"with the fp32 GELU on {f32_wins}/{len(rows)}")  # fmt: skip
        print(f"round by round (kfuse / gemm_only quartiles): faster on {verdicts[-1]}, a tie within the rounds' spread on "
              f"{verdicts[0]}, slower on {verdicts[1]}")  # fmt: skip


if __name__ == "__main__":
    main()
