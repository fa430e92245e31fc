"""Issue 7 on the GPU: ``kfuse.compile(..., sass=True)`` end to end on an embedded model.

The model is compiled twice in one process, plain and with ``sass=True``. The second compile
profiles the plan, captures the hottest single-launch Triton kernels and tunes their SASS
schedules, installing only verified ones. The first compile's CUDA graph was captured before any
install, so it keeps Triton's schedules. Both are then timed side by side (20 replays of the
whole-plan graph each, medians) and checked against eager PyTorch.
Prediction (sessions 1-7 found no schedule 1% faster on five kernels): the tuner tries the hottest
non-TMA kernels (attention, norm), installs nothing, and the two times agree within noise. What this
run checks is the wiring: capture, verification and install, with the report's reasons.

    PYTHONPATH=.:<pyelftools wheel> python benchmarks/experiments/sass_compile_probe.py --out $OUT   # H200, ~240 s
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import kfuse
import kfuse.models
from kfuse.bench.harness import gpu_name, max_rel_err, time_ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="bert-base")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--kernels", type=int, default=2)
    p.add_argument("--samples", type=int, default=10_000)
    p.add_argument("--iterations", type=int, default=150, help="annealing steps per seed (3 seeds)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sass_compile_probe needs a CUDA GPU")
    model, args, kwargs = kfuse.models.build(a.model, batch=a.batch, seq=a.seq, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        ref = model(*args, **kwargs)
    plain = kfuse.compile(model, args, kwargs)
    t0 = time.perf_counter()
    tuned = kfuse.compile(model, args, kwargs, sass=True, sass_kernels=a.kernels, sass_samples=a.samples, sass_iterations=a.iterations)
    compile_s = time.perf_counter() - t0
    rep = tuned.report.get("sass", {})
    with torch.no_grad():
        t_plain = time_ms(lambda: plain(*args, **kwargs), warmup=5, rep=20)
        t_tuned = time_ms(lambda: tuned(*args, **kwargs), warmup=5, rep=20)
        t_plain2 = time_ms(lambda: plain(*args, **kwargs), warmup=5, rep=20)  # A B A: clock drift shows
        err_plain, err_tuned = max_rel_err(plain(*args, **kwargs), ref), max_rel_err(tuned(*args, **kwargs), ref)
    res = {"experiment": "sass_compile_probe", "gpu": gpu_name(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
           "model": a.model, "batch": a.batch, "seq": a.seq, "plain_ms": [t_plain, t_plain2], "sass_ms": t_tuned,
           "max_rel_err": {"plain": err_plain, "sass": err_tuned}, "sass_compile_s": compile_s, "sass": rep}  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sass_compile_probe.json").write_text(json.dumps(res, indent=1, default=str))
    for k in rep.get("kernels", []):
        print(f"  tuned {k['kernel']:40s} step {k['step_ms']:.4f} ms  accepted {k['accepted']}  {k['reason']}")
    for s in rep.get("skipped", []):
        print(f"  skipped {s['step']:30s} {s['ms']:.4f} ms  {s['reason']}")
    print(f"{a.model}: plain {t_plain:.4f} / {t_plain2:.4f} ms, sass {t_tuned:.4f} ms, err {err_plain:.1e} / {err_tuned:.1e}, "
          f"sass compile {compile_s:.0f} s, applied {rep.get('applied')}")  # fmt: skip


if __name__ == "__main__":
    main()
