"""Which GEMMs make a CUDA graph depend on PyTorch's cached cuBLAS workspace (GPU only).

    PYTHONPATH=. python benchmarks/experiments/cublas_workspace_probe.py --out $OUT

Session 26: Llama-1b B8 S512 faulted on kfuse's first replay after a reduce-overhead baseline,
and passed once kfuse's captures took their own workspace (``own_cublas_workspace``). For each GEMM
below, in a child process with and without that fix: a throwaway capture on torch.cuda.graph's
shared capture stream caches a workspace in its pool and is deleted; a kfuse CUDA-graph runner
captures the same GEMM; the cache is cleared and freed memory released, as torch.compile's graph
trees do; the runner replays. Only GEMMs whose cuBLAS algorithm uses the workspace can fault.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# name -> (x shape, w shape (out, in), with bias): torch.nn.functional.linear
GEMMS = {
    "mm_1024": ((1024, 1024), (1024, 1024), False),
    "splitk_64x64x65536": ((64, 65536), (64, 65536), False),
    "linear_bias_64x64x65536": ((64, 65536), (64, 65536), True),
    "linear_bias_4096x2048x2048": ((4096, 2048), (2048, 2048), True),
    "linear_bias_4096x2048x8192": ((4096, 8192), (2048, 8192), True),
}

SCENARIO = """
import sys
import torch
import kfuse.runtime.cuda_graph as cg
from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.runtime.executor import lower

xs, ws, bias = {spec}
if {nofix}:
    cg.own_cublas_workspace = lambda cuda: None
x = torch.randn(xs, device="cuda", dtype=torch.float16)
w = torch.randn(ws, device="cuda", dtype=torch.float16) / ws[1] ** 0.5
b = torch.randn(ws[0], device="cuda", dtype=torch.float16) if bias else None
f = lambda t: torch.nn.functional.linear(t[0], t[1], b)
f([x, w])
torch.cuda.synchronize()
tmp = torch.cuda.CUDAGraph()
with torch.cuda.graph(tmp):
    f([x, w])
del tmp
gb = GraphBuilder("lin")
gx = gb.add_input("x", TensorType(xs, torch.float16))
gw = gb.add_input("w", TensorType(ws, torch.float16))
out_t = TensorType((xs[0], ws[0]), torch.float16)
g = gb.build([gb.op("fallback", [gx, gw], {{"fn": f, "target": "linear", "out_type": out_t}})])
r = cg.CudaGraphRunner(lower(g, torch.device("cuda"), "torch"), [x, w])
assert r.captured, r.reason
torch._C._cuda_clearCublasWorkspaces()
torch.cuda.empty_cache()
junk = [torch.full((1 << 22,), float("nan"), device="cuda") for _ in range(64)]
for _ in range(3):
    x2 = torch.randn(xs, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(r([x2, w])[0], f([x2, w]), rtol=2e-2, atol=2e-2)
torch.cuda.synchronize()
print("ok")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    rows = []
    for name, spec in GEMMS.items():
        for nofix in (True, False):
            src = SCENARIO.format(spec=repr(spec), nofix=nofix)
            p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120)
            err = [ln for ln in p.stderr.splitlines() if "Error" in ln][-1:] or [""]
            rows.append({"gemm": name, "fix": not nofix, "rc": p.returncode, "error": err[0][:200]})
            print(f"{name:30s} fix={not nofix!s:5s} rc={p.returncode} {err[0][:120]}", flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cublas_workspace_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
