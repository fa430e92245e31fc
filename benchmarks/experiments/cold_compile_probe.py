"""Cold compile time with and without worker-process compiles (kfuse.runtime.parallel_compile).

Each (model, mode) compiles in a fresh process with empty Triton, kfuse-kernel and tuning caches, so
every kernel is compiled from scratch: mode "workers" is the default (recorded kernels compiled on
worker processes), mode "threads" sets KFUSE_COMPILE_WORKERS=0 (the previous behaviour: thread pools
in the tuner and the b2b decision, the rest one kernel after the other). A child past ``--timeout``
is stopped and reported as such. Each record holds the compile's phases (``report["compile_phases_s"]``),
the kernel each GELU GEMM runs, the b2b decisions, and with ``--cprofile`` the main process's profile in
its log (session 33).

    PYTHONPATH=. python benchmarks/experiments/cold_compile_probe.py --out $OUT \
        --cases bert-base:8:128,nerf-mlp:3 --modes workers,threads --timeout 240
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


def child(name: str, batch: int, seq: int | None, timeout: float) -> None:
    import faulthandler
    import logging

    import torch

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kfuse.parallel_compile").setLevel(logging.INFO)
    faulthandler.dump_traceback_later(max(10.0, timeout - 15), exit=False)  # where the time went, if it runs out

    import kfuse
    import kfuse.models as zoo

    dtype = torch.float16 if name.startswith(("bert", "gpt", "vit", "llama")) else torch.float32
    kw = {"batch": batch} | ({"seq": seq} if seq else {})
    model, args, kwargs = zoo.build(name, dtype=dtype, device="cuda", **kw)
    prof = None
    if os.environ.get("KFUSE_PROBE_CPROFILE") == "1":  # where the main process's compile time goes (workers not included)
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    c = kfuse.compile(model, args, kwargs, tune="fast")
    compile_s = time.perf_counter() - t0
    if prof is not None:
        import io
        import pstats

        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
        print("CPROFILE\n" + buf.getvalue()[-9000:], file=sys.stderr)
    r = c.report
    tune = r.get("tune")
    out = {
        "compile_s": round(compile_s, 2),
        "parallel_compile": r.get("parallel_compile"),
        "tune_s": round(getattr(tune, "seconds", 0.0), 2) if tune is not None else None,
        "phases_s": r.get("compile_phases_s"),
        # which kernel each GELU GEMM runs (issue 3: the tuned ping-pong kernel or cuBLASLt + a pointwise kernel)
        "gelu_gemms": [
            {k: v for k, v in kern.items() if k in ("name", "template", "config", "epilogue")}
            for kern in r.get("kernels", [])
            if "gelu" in str(kern.get("epilogue", "")) + " ".join(kern.get("ops", []))
        ],
        "b2b_fused": len((r.get("b2b") or {}).get("fused", [])),
        "max_rel_err": r.get("max_rel_err"),
        "check": r.get("check"),
        "b2b_decisions": [
            {k: v for k, v in d.items() if k in ("node", "widths", "config", "fused_ms", "unfused_ms", "candidates_compiled_in", "tried")}
            for d in ((r.get("b2b") or {}).get("fused") or [])
        ],
    }
    print("RESULT " + json.dumps(out, default=str))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="bert-base:8:128,nerf-mlp:3")
    ap.add_argument("--modes", default="workers,threads")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--child", default=None)
    ap.add_argument("--cprofile", action="store_true", help="profile the main process's compile (printed into each record's log)")
    a = ap.parse_args()
    if a.child:
        name, *rest = a.child.split(":")
        child(name, int(rest[0]), int(rest[1]) if len(rest) > 1 else None, a.timeout)
        return
    records = []
    for case in a.cases.split(","):
        for mode in a.modes.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, TRITON_CACHE_DIR=f"{tmp}/triton", KFUSE_CACHE_DIR=f"{tmp}/kfuse", HOME=tmp)
                if mode == "threads":
                    env["KFUSE_COMPILE_WORKERS"] = "0"
                if a.cprofile:
                    env["KFUSE_PROBE_CPROFILE"] = "1"
                t0 = time.perf_counter()
                try:
                    p = subprocess.run([sys.executable, __file__, "--out", a.out, "--child", case, "--timeout", str(a.timeout)], env=env,
                                       capture_output=True, text=True, timeout=a.timeout)  # fmt: skip
                    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
                    rec = json.loads(line[7:]) if line else {"error": p.stderr[-1500:]}
                    rec["log"] = p.stderr[-16000:]
                except subprocess.TimeoutExpired as e:
                    err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
                    rec = {"error": f"timeout after {a.timeout:.0f} s", "log": err[-12000:]}
                rec.update(case=case, mode=mode, wall_s=round(time.perf_counter() - t0, 1), cpus=os.cpu_count())
                records.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "log"}, default=str), flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cold_compile_probe.json").write_text(json.dumps(records, indent=2, default=str))
    print(f"\n{'case':18s} {'mode':8s} {'compile_s':>9s} {'wall_s':>7s}  parallel_compile")
    for r in records:
        took = str(r.get("compile_s", r.get("error", "")))[:9]
        print(f"{r['case']:18s} {r['mode']:8s} {took:>9s} {r['wall_s']:7.1f}  {r.get('parallel_compile')}")


if __name__ == "__main__":
    main()
