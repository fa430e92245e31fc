"""Tuning alone, from empty caches: a model's GEMM / conv problems (as ``kfuse.compile`` finds them)
tuned by ``Tuner.choose`` in a fresh process with an empty tuning database and an empty Triton
cache (session 34; ``--dtype float32`` for the fp32 compiles of session 33's ``cold_compile_probe.py``,
which builds CNNs in fp32). Variants: ``default``; ``threads`` (``KFUSE_COMPILE_WORKERS=0``: no worker
processes). Session 34's runs compared two tuner mechanisms as ``on`` / ``off`` (compiled candidates
measured in place of new compiles; batches measured before their slowest compiles); both were refuted
and removed (docs/perf-notes.md, session 34).

Each record: tuning seconds, candidates measured, each problem's seconds,
and each problem's chosen config with its measured time (the sum over problems says whether a
variant chose worse configs). Unlike ``cold_compile_probe.py`` (fp32 for CNNs) the models run in
fp16, as ``tuning_bench.py``.

    PYTHONPATH=. python benchmarks/experiments/tune_only_probe.py --out $OUT \
        --cases resnet50:32,bert-base:32:128
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

VARIANTS = {"default": {}, "threads": {"KFUSE_COMPILE_WORKERS": "0"}}


def child(name: str, batch: int, seq: int | None, dtype_name: str) -> None:
    import logging

    import torch

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kfuse.parallel_compile").setLevel(logging.INFO)
    import kfuse
    import kfuse.models as zoo
    import kfuse.tune.tuner as T
    from kfuse.runtime import parallel_compile

    problems: list = []

    class Found(Exception):
        pass

    real_choose = T.Tuner.choose

    def capture(self, probs):  # noqa: ANN001, ANN202
        problems.extend(probs)
        raise Found

    T.Tuner.choose = capture  # type: ignore[method-assign]
    kw = {"batch": batch} | ({"seq": seq} if seq else {})
    model, args, kwargs = zoo.build(name, dtype=getattr(torch, dtype_name), device="cuda", **kw)
    parallel_compile.start_pool()  # as kfuse.compile does at its start
    t_trace = time.perf_counter()
    try:
        kfuse.compile(model, args, kwargs, tune="fast", check=False)
    except Found:
        pass
    trace_s = time.perf_counter() - t_trace
    T.Tuner.choose = real_choose  # type: ignore[method-assign]
    tuner = T.Tuner("fast", device="cuda", progress=False)
    out = tuner.choose(problems)
    st = tuner.stats
    best = {r.problem.signature(): r.best_ms for r in st.results}
    rec = {
        "tune_s": round(st.seconds, 2), "trace_s": round(trace_s, 2), "problems": st.problems, "tuned": st.tuned,
        "measured": st.measured, "failed": st.failed,
        "sum_best_ms": round(sum(v for v in best.values() if v), 4),
        "problem_s": st.problem_s,
        "chosen": {sig: (cfg.describe() if cfg else None, best.get(sig)) for sig, cfg in out.items()},
        "measured_detail": {r.problem.signature(): [(m.config.describe(), m.time_ms, m.status) for m in r.measured] for r in st.results},
        "line": st.line("fast"),
    }  # fmt: skip
    print("RESULT " + json.dumps(rec))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="resnet50:32,bert-base:32:128")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if unknown := [v for v in a.variants.split(",") if v not in VARIANTS]:
        ap.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    if a.child:
        name, *nums = a.child.split(":")
        child(name, int(nums[0]), int(nums[1]) if len(nums) > 1 else None, a.dtype)
        return
    command = "PYTHONPATH=. python benchmarks/experiments/tune_only_probe.py " + " ".join(sys.argv[1:])
    records = []
    for case in a.cases.split(","):
        for variant in a.variants.split(","):
            tmp = tempfile.mkdtemp(prefix="kfuse_tp_")
            env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(tmp, "triton"), KFUSE_CACHE_DIR=os.path.join(tmp, "kfuse"),
                       KFUSE_TUNE_DB=os.path.join(tmp, "tune.sqlite"), KFUSE_SHIPPED_RECORDS="0", **VARIANTS[variant])  # fmt: skip
            t0 = time.perf_counter()
            try:
                argv = [sys.executable, __file__, "--out", a.out, "--child", case, "--dtype", a.dtype]
                r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=a.timeout)
                lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
                rec = json.loads(lines[-1][7:]) if lines else {"error": f"rc {r.returncode}: {r.stderr[-1500:]}"}
                rec["log"] = "\n".join(ln for ln in r.stderr.splitlines() if "parallel_compile" in ln)[-6000:]
            except subprocess.TimeoutExpired:
                rec = {"error": f"timeout after {a.timeout:.0f} s"}
            rec.update(case=case, variant=variant, dtype=a.dtype, wall_s=round(time.perf_counter() - t0, 1), command=command)
            records.append(rec)
            print(f"{case:18s} {variant:4s} tune {rec.get('tune_s', '-')} s, measured {rec.get('measured', '-')}, "
                  f"sum best {rec.get('sum_best_ms', '-')} ms"
                  + (f"  ERROR {rec['error'][:300]}" if "error" in rec else ""), flush=True)  # fmt: skip
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "tune_only_probe.json").write_text(json.dumps(records, indent=1))
    print("\ncase               variant tune_s measured sum_best_ms")
    for r in records:
        print(f"{r['case']:18s} {r['variant']:7s} {r.get('tune_s', '-')!s:>6} {r.get('measured', '-')!s:>8} "
              f"{r.get('sum_best_ms', '-')!s:>11}")  # fmt: skip


if __name__ == "__main__":
    main()
