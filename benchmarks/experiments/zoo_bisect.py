"""Which compile option makes a zoo_sweep architecture wrong on the GPU? Compiles one architecture once per
variant (the default options, then each with one feature turned off) and prints the error against eager
for each, so the feature whose removal fixes the error names the culprit.

Session 35: RegNet-Y and MobileNet-V2 compiled on the H200 with max_rel_err 0.53 / 0.55 (fp16, B32),
while the CPU interpreter run of the same code was right.

    PYTHONPATH=. python benchmarks/experiments/zoo_bisect.py --arch mobilenet-v2 --batch 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo_sweep  # noqa: E402

import kfuse  # noqa: E402
from kfuse.bench.harness import max_rel_err  # noqa: E402

VARIANTS = {
    "default": {},
    "no_pdl": {"pdl": False},
    "no_memory_plan": {"memory_plan": False},
    "no_cuda_graphs": {"cuda_graphs": False},
    "nchw": {"layout": "nchw"},
    "no_pointwise": {"fuse_pointwise": False},
    "no_b2b": {"fuse_b2b": False},
    "no_epilogue": {"fuse_epilogue": False},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", required=True, choices=sorted(zoo_sweep.ARCHS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--variants", default="default,no_pdl,no_memory_plan,no_cuda_graphs,nchw")
    p.add_argument("--tune", default="fast")
    p.add_argument("--out", default="")
    args = p.parse_args()
    model, a, kw = zoo_sweep.build(args.arch, False, "cuda", torch.float16)
    a = tuple(x[: args.batch] for x in a)
    with torch.no_grad():
        ref = zoo_sweep.first_tensor(model(*a, **kw))
        rows = []
        for name in args.variants.split(","):
            t0 = time.perf_counter()
            try:
                cm = kfuse.compile(model, a, kw, tune=args.tune, **VARIANTS[name])
                out = zoo_sweep.first_tensor(cm(*a, **kw))
                row = {"variant": name, "err": max_rel_err(out, ref), "report_err": cm.report.get("max_rel_err"),
                       "s": round(time.perf_counter() - t0, 1)}  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a variant that fails is a finding too
                row = {"variant": name, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            rows.append(row)
            print(args.arch, row, flush=True)
            if "CUDA error" in row.get("error", ""):
                break
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        rec = {"arch": args.arch, "batch": args.batch, "rows": rows}
        (Path(args.out) / f"zoo_bisect_{args.arch}.json").write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
