"""Check stencil7's TMA-fed worker partition on the GPU, each variant in a process of its own (a fault loses the CUDA
context): the partition's code as a kernel of its own (``ws_partition.launch_tma_alone``) and beside the ping-pong GEMM
(``launch_fused``), every output against its reference, with the time of each launch. ``--sanitizer``: the first
variant that fails runs again under compute-sanitizer on a short block range, for the faulting instruction.

    PYTHONPATH=. python benchmarks/experiments/ws_tma_check.py --out $OUT/tma_check [--sanitizer]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# name -> (host tile or None for the partition alone, BE warps, ring slots, blocks an iteration)
VARIANTS: dict[str, tuple[str | None, int, int, int]] = {
    "alone w8 s4": (None, 8, 4, 1),
    "alone w4 s3": (None, 4, 3, 1),
    "alone w8 s1": (None, 8, 1, 1),
    "alone w8 u2 s2": (None, 8, 2, 2),
    "alone w8 u2 s3": (None, 8, 3, 2),
    "fused s6 w8 s4": ("pp64x128 s6", 8, 4, 1),
    "fused s6 w4 s4": ("pp64x128 s6", 4, 4, 1),
    "fused s6 w8 u2 s2": ("pp64x128 s6", 8, 2, 2),
    "fused pp128 w4 s3": ("pp128 s4", 4, 3, 1),
}


def run_one(name: str, blocks: int) -> dict[str, Any]:
    """One variant in this process: poison, run, compare, time."""
    import torch

    from kfuse.bench.harness import gpu_time_ms
    from kfuse.colocate import workloads, ws_partition
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
    from kfuse.kernels.gemm import reference

    host, warps, slots, unroll = VARIANTS[name]
    dev = torch.device("cuda")
    work = workloads.make("stencil7", device=dev)
    end = blocks or work.kernel.n_blocks
    out: dict[str, Any] = {"variant": name, "blocks": end}
    if host is None:
        work.reset()
        ws_partition.launch_tma_alone(work, 0, end, warps=warps, slots=slots, unroll=unroll)
        torch.cuda.synchronize()
        out["be_err"] = workloads.error(work) if end == work.kernel.n_blocks else None
        out["ms"] = gpu_time_ms(lambda: ws_partition.launch_tma_alone(work, 0, end, warps=warps, slots=slots, unroll=unroll))
        return out
    cfg, loader = {n: (c, ld) for n, c, ld in ws_partition.HOST_TILES}[host]
    m, n, k = 1024, 3072, 768  # BERT-base's FFN1 at B8 S128
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dev, torch.float16)
    b = (torch.randn(k, n, generator=g) / 32).to(dev, torch.float16)
    bias = torch.randn(n, generator=g).to(dev, torch.float16)
    epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))),), 1)
    ref = reference(a, b, [bias.view(1, n).expand(m, n)], epi, torch.float16).float()
    c = torch.full((1, m, n), float("nan"), device=dev, dtype=torch.float16)
    work.reset()

    def fused() -> None:
        ws_partition.launch_fused(a.view(1, m, k), b.view(1, k, n), c, [bias.view(1, 1, n).expand(1, m, n)], epi, cfg, work, 0, end,
                                  132, warps=warps, loader_regs=loader, unroll=unroll, feed="tma", slots=slots)  # fmt: skip

    fused()
    torch.cuda.synchronize()
    out["gemm_err"] = ((c[0].float() - ref).abs().max() / ref.abs().max()).item()
    out["be_err"] = workloads.error(work) if end == work.kernel.n_blocks else None
    out["ms"] = gpu_time_ms(fused)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="folder for tma_check.json")
    ap.add_argument("--one", default="", help="(internal) run this variant in this process and print its JSON")
    ap.add_argument("--blocks", type=int, default=0, help="BE blocks [0, blocks) (0: the whole kernel)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--sanitizer", action="store_true", help="run the first failing variant under compute-sanitizer")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a.blocks)), flush=True)
        return
    results = []
    failed = None
    for name in a.variants.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--blocks", str(a.blocks)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=os.environ)
            rec = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"variant": name, "rc": r.returncode}
            if r.returncode:
                rec["error"] = r.stderr.strip().splitlines()[-1][-300:] if r.stderr.strip() else ""
        except subprocess.TimeoutExpired:
            rec = {"variant": name, "error": "timed out (180 s): a hang"}
        ok = "error" not in rec and all(rec.get(k) is None or rec[k] < 2e-2 for k in ("gemm_err", "be_err"))
        rec["ok"] = ok
        failed = failed or (None if ok else name)
        results.append(rec)
        print(json.dumps(rec), flush=True)
    sanitizer = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None
    )
    if a.sanitizer and failed and sanitizer:
        cmd = [sanitizer, "--print-limit", "5", sys.executable, __file__, "--one", failed, "--blocks", "2000"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=os.environ)
        results.append({"variant": failed, "sanitizer": (r.stdout + r.stderr)[-6000:]})
        print((r.stdout + r.stderr)[-4000:], flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "tma_check.json").write_text(json.dumps(results, indent=1))
    print("\nvariant               ok     ms       gemm_err  be_err")
    for r in results:
        if "ok" in r:
            errs = f"{r.get('gemm_err') or 0:9.1e} {r.get('be_err') or 0:9.1e}"
            print(f"{r['variant']:20s} {r['ok']!s:6s} {r.get('ms', float('nan')):8.4f} {errs} {r.get('error', '')[:120]}")


if __name__ == "__main__":
    main()
