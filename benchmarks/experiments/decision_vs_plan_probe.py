"""Issue 5 on the GPU: why does the compiled plan run a b2b chain's chosen side slower than the
decision timed it?

Session 15, three runs at M = 1M, 256 -> 256 -> 256: the decision (``kfuse.kernels.b2b.lower._decide``)
timed the pair at 0.622-0.650 ms, and the bench then measured the plan at 0.666-0.719 ms with that
pair in place (2.5-15% slower). Both are ``graph_ms_per_call`` replays. What differs:

* calls per graph: 10 in the decision, 20 in the bench;
* inputs: random tensors made by the decision vs the bench's ``x``;
* what is called: the step's closure directly vs ``execute(plan, ...)`` vs the compiled model;
* the order in which things run in the process (the decision runs during the compile).

This probe times one chain every way, both sides (fused and unfused, from ``step.b2b_sides``), in
A B B A order, three rounds, and prints a table: the way whose time moves with the plan's is the
cause. Compiled with ``b2b_recheck=False`` so the plan keeps the decision's side.

    PYTHONPATH=. python benchmarks/experiments/decision_vs_plan_probe.py --out $OUT/r   # H200, ~60 s
    PYTHONPATH=. python benchmarks/experiments/decision_vs_plan_probe.py --out /tmp/p --smoke
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

if "--smoke" in sys.argv:
    import torch as _t

    if not _t.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from torch import nn

import kfuse
from kfuse.bench.harness import graph_ms_per_call, write_experiment
from kfuse.runtime.executor import execute


def _mlp(k0: int, n0: int, n1: int, dtype: torch.dtype, device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(k0, n0), nn.ReLU(), nn.Linear(n0, n1)).to(device=device, dtype=dtype).eval()


def probe(m: int, widths: tuple[int, int, int], device: str, dtype: torch.dtype, rounds: int) -> dict[str, Any]:
    k0, n0, n1 = widths
    model = _mlp(k0, n0, n1, dtype, device)
    x = torch.randn(m, k0, device=device, dtype=dtype)
    # backend "triton" on the CPU too (smoke): the decision is then measured there as well, so the
    # step keeps both sides (its kernels run in the interpreter)
    c = kfuse.compile(model, (x,), cuda_graphs=False, tune="fast" if device == "cuda" else "none", b2b_recheck=False, backend="triton")
    v = next(iter(c.variants.values()))
    plan = v.plan
    step = next(s for s in plan.steps if getattr(s, "b2b_sides", None))
    chosen = "fused" if step.b2b.get("fused") else "unfused"
    # the same chain compiled without b2b: two planned steps, the intermediate in the plan's arena
    # (the bench's kfuse_unfused_ms; session 16 measured it 2.4-7.7% faster than the b2b step's
    # unfused side at M = 1M in two runs, with the same two kernels)
    plain = kfuse.compile(model, (x,), cuda_graphs=False, tune="fast" if device == "cuda" else "none", fuse_b2b=False, backend="triton")
    consts = [plan.constants[i] if i in plan.constants else None for i in step.inputs]
    x_rand = torch.randn_like(x)

    def operands(xin: torch.Tensor) -> list[torch.Tensor]:
        return [xin if t is None else t for t in consts]

    ways = {
        "closure, random x, 10 calls (the decision)": lambda run: graph_ms_per_call(lambda: run(operands(x_rand)), (), calls=10)[0],
        "closure, random x, 20 calls": lambda run: graph_ms_per_call(lambda: run(operands(x_rand)), (), calls=20)[0],
        "closure, bench x, 20 calls": lambda run: graph_ms_per_call(lambda: run(operands(x)), (), calls=20)[0],
        "execute(plan), 20 calls": lambda run: graph_ms_per_call(lambda: execute(plan, [x]), (), calls=20)[0],
        "compiled model, 20 calls (the bench)": lambda run: graph_ms_per_call(c, (x,), calls=20)[0],
        "fuse_b2b=False model, 20 calls (either side)": lambda run: graph_ms_per_call(plain, (x,), calls=20)[0],
    }
    times: dict[str, dict[str, list[float]]] = {w: {"fused": [], "unfused": []} for w in ways}
    for _ in range(rounds):
        for side in ("fused", "unfused", "unfused", "fused"):
            run, info, _fields = step.b2b_sides[side]
            step.fn, step.info = run, info
            for w, fn in ways.items():
                times[w][side].append(fn(run))
    med = {w: {s: sorted(t)[len(t) // 2] for s, t in d.items()} for w, d in times.items()}
    return {"case": f"M{m}_{k0}x{n0}x{n1}", "decision": {k: step.b2b.get(k) for k in ("fused_ms", "unfused_ms", "config")},
            "chosen": chosen, "median_ms": med, "times_ms": times}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="1048576:256x256x256,262144:256x256x256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter)")
    a = ap.parse_args()
    gpu = torch.cuda.is_available() and not a.smoke
    device, dtype = ("cuda", torch.float16) if gpu else ("cpu", torch.float32)
    cases = [(int(m), tuple(int(v) for v in w.split("x"))) for m, w in (c.split(":") for c in a.cases.split(","))]
    if a.smoke:
        cases, a.rounds = [(48, (32, 288, 16))], 1
    t0 = time.perf_counter()
    recs = [probe(m, w, device, dtype, a.rounds) for m, w in cases]
    write_experiment("decision_vs_plan_probe", a.out, records=recs)
    for r in recs:
        print(f"{r['case']}: decision fused {r['decision']['fused_ms']} / unfused {r['decision']['unfused_ms']} ms, chose {r['chosen']}")
        print(f"  {'way':44s} {'fused ms':>9s} {'unfused ms':>10s}")
        for w, d in r["median_ms"].items():
            print(f"  {w:44s} {d['fused']:9.4f} {d['unfused']:10.4f}")
    print(f"(total {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
