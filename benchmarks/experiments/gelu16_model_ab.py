"""The f16x2 GELU epilogue (session 29) end to end: one model compiled twice by kfuse in one process,
with ``KFUSE_GELU16=1`` (the default) and ``=0`` (the fp32 form of sessions 18-28), timed A/B in rotated
rounds (``ab_ms``) beside eager in a CUDA graph, each checked against eager.

Why: ``gemm_bench`` measured the epilogue alone 0.3-4% faster; a model's GELU GEMMs are one in four of
its GEMMs (BERT, ViT) and run only where the Gluon kernels win the compiler's measured decisions, so the
prediction end to end is 0-1%. The Gluon kernels read the setting at launch, and a compiled model's
launches are captured at its first call, so each compile is called once under its own setting.

    PYTHONPATH=. python benchmarks/experiments/gelu16_model_ab.py --out $OUT   # H200, ~2 min
"""

from __future__ import annotations

import argparse
import os

import torch

import kfuse
from kfuse.bench.harness import ab_ms, max_rel_err, pytorch_baselines, write_experiment
from kfuse.models import zoo

CASES = [("bert-base", 32, 128), ("vit-b16", 64, None)]


def _compiled(model: torch.nn.Module, args: tuple, gelu16: str) -> tuple[kfuse.CompiledModel, torch.Tensor]:
    os.environ["KFUSE_GELU16"] = gelu16
    try:
        c = kfuse.compile(model, args)
        with torch.no_grad():
            out = c(*args)
            torch.cuda.synchronize()
        return c, out
    finally:
        os.environ.pop("KFUSE_GELU16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=9)
    args_ = ap.parse_args()
    recs = []
    for name, batch, seq in CASES:
        model, args, _ = zoo.build(name, batch=batch, seq=seq, dtype=torch.float16, device="cuda")
        base, outs, _ = pytorch_baselines(model, args, which=["eager", "eager_cudagraph"])
        ref = outs["eager"]
        (on, out_on), (off, out_off) = _compiled(model, args, "1"), _compiled(model, args, "0")
        with torch.no_grad():
            ms = ab_ms({"gelu16": lambda on=on: on(*args), "fp32_gelu": lambda off=off: off(*args)}, rounds=args_.rounds)
        rec = {"case": f"{name} B{batch}" + (f" S{seq}" if seq else ""), "ms": ms, "eager_cudagraph_ms": base.get("eager_cudagraph"),
               "err_gelu16": max_rel_err(out_on, ref), "err_fp32_gelu": max_rel_err(out_off, ref),
               "gain": ms["fp32_gelu"] / ms["gelu16"] - 1}  # fmt: skip
        recs.append(rec)
        print(f"{rec['case']:24s} gelu16 {ms['gelu16']:.4f} ms  fp32 gelu {ms['fp32_gelu']:.4f} ms  ({100 * rec['gain']:+.1f}%)  "
              f"eager in a graph {rec['eager_cudagraph_ms']:.4f}  err {rec['err_gelu16']:.1e} / {rec['err_fp32_gelu']:.1e}",
              flush=True)  # fmt: skip
        del on, off, model
        torch.cuda.empty_cache()
    write_experiment("gelu16_model_ab", args_.out, records=recs, rounds=args_.rounds,
                     timing="whole compiled calls (each replays its CUDA graph), A/B in rotated rounds (median)")  # fmt: skip


if __name__ == "__main__":
    main()
