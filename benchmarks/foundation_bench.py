"""Issue 2 baseline on the GPU: bert-base (B=32, S=128) and resnet50 (B=64), fp16, kfuse vs PyTorch.

Also sweeps the GEMM-epilogue kernel over odd shapes on the GPU (NaN-poisoned outputs) so the
first timing table rests on a kernel checked on real hardware.

    PYTHONPATH=. python benchmarks/foundation_bench.py --out $OUT [--baselines eager,eager_cudagraph,compile]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import kfuse
import kfuse.models as zoo
from kfuse.bench.harness import floor_ms, make_record, max_rel_err, pytorch_baselines, time_ms, write_results
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import gemm_epilogue, reference

CASES = {
    # name: (model, batch, seq, flops, case)
    "bert_base": ("bert-base", 32, 128, 0.72e12, "B32_S128"),
    "resnet50": ("resnet50", 64, None, 64 * 8.2e9, "B64"),
}


def gemm_sweep() -> float:
    epi = Epilogue(
        (
            EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))),
            EpilogueStep("gelu", (Operand("reg", 1),)),
            EpilogueStep("add", (Operand("reg", 2), Operand("in", 1))),
        ),
        2,
    )
    worst = 0.0
    for m, n, k in [(1, 768, 768), (37, 29, 45), (4096, 3072, 768), (4096, 768, 3072), (1000, 1000, 1000), (129, 257, 63)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16) / k**0.5
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        res = torch.randn(m, n, device="cuda", dtype=torch.float16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        gemm_epilogue(a, b, [bias, res], epi, torch.float16, out=out)
        err = max_rel_err(out, reference(a, b, [bias, res], epi, torch.float16))
        worst = max(worst, err)
        print(f"gemm_epilogue {m}x{n}x{k}: max_rel_err {err:.2e}")
    return worst


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/h200")
    p.add_argument("--baselines", default="eager,eager_cudagraph,compile")
    p.add_argument("--only", default=",".join(CASES))
    args = p.parse_args()
    command = "PYTHONPATH=. python benchmarks/foundation_bench.py " + " ".join(sys.argv[1:])
    print(f"gemm sweep worst error {gemm_sweep():.2e}")
    table = []
    for name in args.only.split(","):
        model_name, batch, seq, flops, case = CASES[name]
        try:
            m, a, kw = zoo.build(model_name, batch=batch, seq=seq, dtype=torch.float16, device="cuda")
            print(f"== {model_name} {case}")
            with torch.no_grad():
                t0 = time.perf_counter()
                compiled = kfuse.compile(m, a, kw)
                compile_s = time.perf_counter() - t0
                times, outs, _ = pytorch_baselines(m, a, kw, which=args.baselines.split(","))
                t_k = time_ms(lambda: compiled(*a, **kw))
                err = max_rel_err(compiled(*a, **kw), outs["eager"])
            rep = compiled.report
            n_k = sum(k["template"] not in ("torch", "fallback") for k in rep["kernels"])
            rec = make_record(
                name, case, t_k, times, floor_ms(flops, 0), err, command,
                kfuse_compile_s=compile_s, launches=len(rep["kernels"]), kfuse_kernels=n_k,
                cuda_graph=rep["cuda_graph"], stage="foundation (issue 2)",
                notes="max_autotune not run in the foundation baseline (issue anchors: bert-base 3.54 ms, resnet50 3.17 ms)",
            )  # fmt: skip
            write_results(name, [rec], args.out)
            table.append((name, case, t_k, times, err, len(rep["kernels"]), n_k))
        except Exception as e:  # one failing case must not hide the others
            print(f"{name} failed: {type(e).__name__}: {e}")
    print(
        "\nmodel       case       kfuse_ms  "
        + "  ".join(f"{b:>15s}" for b in args.baselines.split(","))
        + "  max_rel_err launches kfuse_kernels"
    )
    for name, case, t_k, times, err, nl, nk in table:
        cols = "  ".join(f"{times.get(b, float('nan')):15.3f}" for b in args.baselines.split(","))
        print(f"{name:11s} {case:9s} {t_k:9.3f}  {cols}  {err:.2e} {nl:8d} {nk:8d}")


if __name__ == "__main__":
    main()
