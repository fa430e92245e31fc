#!/usr/bin/env python3
"""Each BE kernel's solo forms, timed: the original kernel (one program per block) and the PTB kernel on 1-16
programs an SM, optionally on other warp counts (``--warps``). Issue 8, session 65's caveat: time sharing (and the x
of every fused profile) runs the BE kernel as PTB on 4 programs an SM, and the 8-warp worker partition ran histogram's
blocks 1.4-1.7x faster than that (fused slopes 0.60-0.71 past the GEMM's window). If a solo form is as fast, time
sharing should run it, and the `ws` gains shrink. (Session 66 found 8 warps 2.1x faster for histogram; the harness now
picks each BE kernel's fastest form itself: ``kfuse.colocate.be_forms``, ``--be-form fastest``.)

    PYTHONPATH=. python benchmarks/experiments/be_solo_forms.py --out OUT.json
    PYTHONPATH=. python benchmarks/experiments/be_solo_forms.py --smoke --out /tmp/x.json   # CPU, the interpreter

Every form's output is checked against the workload's reference before it is timed (poisoned outputs, ``reset``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from kfuse.bench.harness import time_ms  # noqa: E402
from kfuse.colocate import ptb, workloads  # noqa: E402


def _ok(w: workloads.Workload) -> bool:
    return workloads.error(w) <= max(w.tol, 1e-6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--be", default="histogram,mriq,stencil7,cutcp")
    ap.add_argument("--per-sm", default="1,2,4,8,16", help="PTB grids: programs per SM")
    ap.add_argument("--warps", default="", help="also the PTB grids on these warp counts (the kernel's own: plain ptbN)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="small problems in the Triton interpreter (CPU)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    sms = ptb.num_sms(device)
    reps = 2 if a.smoke else a.reps
    records = []
    print(f"{torch.cuda.get_device_name() if device == 'cuda' else 'CPU (interpreter)'}, {sms} SMs")
    for name in a.be.split(","):
        w = workloads.make(name, small=a.smoke, device=device)
        k = w.kernel
        runs = {"original": lambda: ptb.launch_original(k)}
        grids = [int(x) for x in a.per_sm.split(",")]
        runs |= {f"ptb{p}": (lambda grid=p * sms: ptb.launch_ptb(k, 0, k.n_blocks, grid)) for p in grids}
        for nw in (int(x) for x in a.warps.split(",") if x and int(x) != k.num_warps):
            kw = dataclasses.replace(k, num_warps=nw)  # the same block function, another block shape
            runs |= {f"ptb{p}_w{nw}": (lambda grid=p * sms, kw=kw: ptb.launch_ptb(kw, 0, kw.n_blocks, grid)) for p in grids}
        forms: dict[str, dict[str, float | bool]] = {}
        for form, run in runs.items():
            try:
                w.reset()  # poisoned outputs, checked against the reference, then timed
                run()
                forms[form] = {"ok": _ok(w), "ms": time_ms(run, warmup=1, rep=reps, device=device)}
            except Exception as e:  # a block shape the kernel's layout does not allow: recorded, not timed
                forms[form] = {"ok": False, "ms": float("inf"), "error": f"{type(e).__name__}: {str(e)[:200]}"}
        base = forms.get("ptb4", forms["original"])["ms"]
        best = min((f for f in forms if forms[f]["ok"]), key=lambda f: forms[f]["ms"])
        rec = {"benchmark": "be_solo_forms", "case": name, "blocks": k.n_blocks, "sms": sms, "forms": forms, "best": best,
               "best_vs_ptb4": base / forms[best]["ms"], "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "command": " ".join(sys.argv)}  # fmt: skip
        rec["warps"] = k.num_warps
        records.append(rec)
        cells = "  ".join(f"{f} {v['ms']:.4f}{'' if v['ok'] else ' WRONG'}" for f, v in forms.items())
        print(f"{name:10s} {cells}  best {best} ({rec['best_vs_ptb4']:.2f}x ptb4)")
        if not all(v["ok"] for v in forms.values()):
            print(f"{name}: a form computed a wrong result", file=sys.stderr)
    Path(a.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
