"""Probe for the "unspecified launch failure" of Llama-1b B8 S512 in session 26's models_bench run (GPU only).

    PYTHONPATH=. python benchmarks/experiments/llama_fault_probe.py --out $OUT

The run compiled the model with kfuse (its check against PyTorch passed), timed the four PyTorch
baselines (the new ``compile_cudagraphs`` last) and faulted on kfuse's first call after them;
session 25 ran the same case without ``compile_cudagraphs``. A fault poisons the CUDA context, so
each step runs in its own process, sharing one tuning database (the same configs every time):

1. ``kfuse``: compile, 30 graph replays, compare with eager;
2. ``ro``: ``torch.compile(mode="reduce-overhead")`` alone, 30 replays;
3. ``kfuse_after_ro``: kfuse compile, the reduce-overhead baseline, kfuse again (the failing order);
4. ``blocking`` (only if a kfuse step faulted): kfuse without the CUDA graph and PDL under
   ``CUDA_LAUNCH_BLOCKING=1``, so the failing launch raises where it is issued.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASE = ("llama-1b", 8, 512)


def _model():
    import torch

    import kfuse.models

    name, batch, seq = CASE
    return kfuse.models.build(name, batch=batch, seq=seq, dtype=torch.float16, device="cuda")


def _step(kind: str) -> None:
    import torch
    from torch.utils import _pytree as pytree

    import kfuse
    from kfuse.bench.harness import kernel_lines, max_rel_err, pytorch_baselines

    m, a, kw = _model()
    with torch.no_grad():
        ref = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, m(*a, **kw))
        if kind in ("kfuse", "kfuse_after_ro", "blocking"):
            blocking = kind == "blocking"
            c = kfuse.compile(m, a, kw, tune="fast", cuda_graphs=not blocking, pdl=not blocking)
            print("kernels:", *kernel_lines(c.report), sep="\n  ", flush=True)
            torch.cuda.synchronize()
            print("compiled; first call", flush=True)
            out = c(*a, **kw)
            torch.cuda.synchronize()
            print("first call ok, err", max_rel_err(out, ref), flush=True)
        if kind in ("ro", "kfuse_after_ro"):
            times, _, _ = pytorch_baselines(m, a, kw, which=["compile_cudagraphs"], warmup=10, rep=30)
            torch.cuda.synchronize()
            print("reduce-overhead ok", times, flush=True)
        if kind != "ro":
            for _ in range(30):
                out = c(*a, **kw)
                torch.cuda.synchronize()
            print("30 calls ok, err", max_rel_err(out, ref), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--step", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.step:
        _step(a.step)
        return
    env = dict(os.environ)
    env.setdefault("KFUSE_TUNE_DB", str(Path(tempfile.mkdtemp()) / "tune.sqlite"))
    results = []
    steps = ["kfuse", "ro", "kfuse_after_ro"]
    while steps:
        step = steps.pop(0)
        e = dict(env, CUDA_LAUNCH_BLOCKING="1") if step == "blocking" else env
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--step", step], env=e, capture_output=True, text=True, timeout=200)
        tail = [ln for ln in (p.stdout + p.stderr).splitlines() if "warn" not in ln.lower()][-40:]
        results.append({"step": step, "rc": p.returncode, "s": round(time.perf_counter() - t0, 1), "tail": tail})
        print(f"=== {step}: rc {p.returncode} in {results[-1]['s']} s", *tail[-25:], sep="\n", flush=True)
        if p.returncode != 0 and step.startswith("kfuse") and "blocking" not in [r["step"] for r in results] + steps:
            steps.append("blocking")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "llama_fault_probe.json").write_text(json.dumps({"case": CASE, "steps": results}, indent=1))
    print("\nstep            rc      s")
    for r in results:
        print(f"{r['step']:15s} {r['rc']:3d} {r['s']:6.1f}")


if __name__ == "__main__":
    main()
