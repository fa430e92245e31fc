"""Which widths make ``b2b_chunked_kernel`` fault on the GPU? Session 36: ConvNeXt-T's and Swin-T's
96 -> 384 -> 96 MLP (fp16, 6272+ rows) hit an illegal address in every chunked candidate on the H200,
while the interpreter, under kfuse's memcheck, ran the same configs right and in bounds.

Each (K0, N1) runs in its own process (a fault loses the CUDA context) over the decision's chunked
candidates, and prints ok / wrong / FAULT per config; ``--sanitize`` then reruns the first faulting case
under compute-sanitizer and prints its first report (the instruction and the address).

    PYTHONPATH=. python benchmarks/experiments/b2b_chunked_fault_probe.py --out $OUT   # H200, ~3 min
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CASES = [(96, 96), (96, 128), (96, 192), (64, 96), (128, 96), (192, 96), (192, 192), (48, 96), (96, 64), (160, 160)]


def run_case(k0: int, n1: int, n0: int, m: int, only: int | None) -> list[dict]:
    """In this process: every chunked candidate of the chain on m rows (or only the ``only``-th)."""
    import torch

    from kfuse.kernels import b2b
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

    r = Operand("reg", 0)
    bias_gelu = Epilogue((EpilogueStep("add", (r, Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
    bias = Epilogue((EpilogueStep("add", (r, Operand("in", 0))),), 1)
    dt = torch.float16
    chain = b2b.Chain((b2b.Stage(bias_gelu, dt), b2b.Stage(bias, dt)))
    torch.manual_seed(0)
    x = torch.randn(m, k0, device="cuda", dtype=dt)
    ws = [(torch.randn(n, k, device="cuda") / k**0.5).to(dt).t() for k, n in ((k0, n0), (n0, n1))]
    ex = [[torch.randn(n0, device="cuda", dtype=dt)], [torch.randn(n1, device="cuda", dtype=dt)]]
    ref = b2b.reference(chain, x.float(), [w.float() for w in ws], [None] * 2, [[e.float() for e in es] for es in ex])
    cfgs = [c for c in b2b.candidate_configs(m, [n0, n1], k0, sms=1) if c.residence == "chunked"]
    rows = []
    for i, cfg in enumerate(cfgs):
        if only is not None and i != only:
            continue
        print(f"RUN {i} {cfg.describe()}", flush=True)
        out = torch.full((m, n1), float("nan"), device="cuda", dtype=dt)
        b2b.b2b_chain(chain, x, ws, [None] * 2, ex, cfg, out=out)
        torch.cuda.synchronize()
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        ok = err < 2e-2 and not torch.isnan(out).any().item()
        rows.append({"i": i, "config": cfg.describe(), "err": err, "result": "ok" if ok else "wrong"})
        print(f"DONE {i} {cfg.describe()} err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="")
    p.add_argument("--m", type=int, default=6272)
    p.add_argument("--n0", type=int, default=384)
    p.add_argument("--case", default="", help="k0,n1[,config index]: run one case in this process")
    p.add_argument("--sanitize", action="store_true")
    p.add_argument("--cases", default="", help="k0,n1:k0,n1:... (default: all of CASES)")
    args = p.parse_args()
    if args.case:
        k0, n1, *only = (int(v) for v in args.case.split(","))
        run_case(k0, n1, args.n0, args.m, only[0] if only else None)
        return

    def child(case: tuple[int, int]) -> dict:
        cmd = [sys.executable, __file__, "--case", f"{case[0]},{case[1]}", "--m", str(args.m), "--n0", str(args.n0)]
        env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        lines = r.stdout.splitlines()
        started = [ln for ln in lines if ln.startswith("RUN")]
        done = [ln for ln in lines if ln.startswith("DONE")]
        faulted = started[len(done)] if r.returncode != 0 and len(started) > len(done) else None
        err_tail = [ln for ln in r.stderr.splitlines() if "Error" in ln][-1:]
        return {"k0": case[0], "n1": case[1], "rc": r.returncode, "done": done, "faulted_at": faulted, "error": err_tail}

    cases = [tuple(int(v) for v in c.split(",")) for c in args.cases.split(":")] if args.cases else CASES
    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(child, cases))
    print(f"{'K0':>4} {'N1':>4}  result")
    for r in results:
        verdict = "FAULT at " + r["faulted_at"][4:] if r["faulted_at"] else ("ok" if r["rc"] == 0 else f"rc {r['rc']} {r['error']}")
        print(f"{r['k0']:4d} {r['n1']:4d}  {len(r['done'])} configs done; {verdict}")
        for d in r["done"]:
            print("      " + d[5:])
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        record = {"min_part": os.environ.get("KFUSE_B2B_MIN_PART", "64 (default)"), "m": args.m, "n0": args.n0, "cases": results}
        Path(args.out, "b2b_chunked_fault_probe.json").write_text(json.dumps(record, indent=1))
    first = next((r for r in results if r["faulted_at"]), None)
    if args.sanitize and first is not None:
        idx = first["faulted_at"].split()[1]
        cs = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        cmd = [cs, "--tool", "memcheck", "--print-limit", "2", sys.executable, __file__, "--case", f"{first['k0']},{first['n1']},{idx}",
               "--m", str(args.m), "--n0", str(args.n0)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print("\n".join((r.stdout + r.stderr).splitlines()[:40]))


if __name__ == "__main__":
    main()
