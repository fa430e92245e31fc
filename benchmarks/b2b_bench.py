"""Issue 5 on the GPU: back-to-back GEMM / conv fusion (persistent, threadblock-resident).

Writes three files (DESIGN §5 records + ``fused``, ``residence``, the fused/unfused timings of
the lowering's decision and the configs it tried):

* ``b2b_gemm.json``: y = relu(x @ W0^T + b0) @ W1^T + b1 (two ``nn.Linear``), fp16, M in
  {65536, 262144, 1048576}, widths K0/N0/N1 in {32/32/32, 64/64/64, 64/128/64, 128/128/128,
  256/256/256}, and three chains with a 1024-wide intermediate (``GEMM_WIDE``); also the unfused
  kfuse pair (``kfuse_unfused_ms``).
* ``b2b_conv.json``: conv3x3(+bias) -> ReLU -> conv1x1(+bias) -> ReLU, fp16 channels-last,
  batch 64, 56x56 and 28x28, 64-512 channels; vs cuDNN eager, in a CUDA graph, torch.compile,
  and kfuse without b2b (the best unfused kfuse pair: two conv_epilogue kernels).
* ``mlp_model.json``: the embedded ``nerf-mlp`` (8 x Linear 256 + ReLU, head 4) end to end.

kfuse is timed as its plan captured in a CUDA graph (``kfuse_ms``, the same footing as
``eager_cudagraph``) and as a plain ``compiled(x)`` call (``kfuse_call_ms``). Since session 5
both graph timings hold ``--graph-calls`` (20) back-to-back calls per graph and report ms per
call (``graph_ms_per_call``): one replay of a one-call graph carries a fixed ~4-8 us on the H200
that is neither kernel's, and dominated the M=65536 chains (2-4 us of DRAM traffic). The one-call
times stay in the records (``kfuse_1call_graph_ms``, and in ``notes`` for eager_cudagraph).
max-autotune runs only on two GEMM chains (M=262144, 64/64/64 and 64/128/64; compile time);
the other records say so in ``notes``. Each section has a time budget (gemm 95 s, conv 40 s,
mlp 40 s; ``--budget-scale``): cases past it are skipped and the log says so.

    PYTHONPATH=. python benchmarks/b2b_bench.py --out $OUT            # H200, ~150-180 s
    PYTHONPATH=. python benchmarks/b2b_bench.py --out /tmp/o --smoke  # CPU wiring check
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

if "--smoke" in sys.argv:
    import torch as _t

    if not _t.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch
from torch import nn

import kfuse
from kfuse.bench.harness import (
    floor_ms,
    graph_ms_per_call,
    kernel_lines,
    make_record,
    max_rel_err,
    pytorch_baselines,
    time_ms,
    write_results,
)

GEMM_M = [262144, 65536, 1048576]  # the anchor M first: if the budget runs out, the rest is skipped
GEMM_WIDTHS = [(32, 32, 32), (64, 64, 64), (64, 128, 64), (128, 128, 128), (256, 256, 256)]
# wide intermediates (past 256 columns: chunked residence, session 15), run after the matrix
GEMM_WIDE = [(262144, (64, 1024, 64)), (65536, (128, 1024, 128)), (262144, (256, 1024, 256))]
AUTOTUNE_CASES = {(262144, (64, 64, 64)), (262144, (64, 128, 64))}  # max-autotune only here (compile time)
SECTION_S = {"gemm": 95.0, "conv": 40.0, "mlp": 40.0}  # seconds per section within the 180 s budget
CONV_CASES = [  # (case, batch, cin, hw, c0, c1)
    ("B64_56x56_64-64-256", 64, 64, 56, 64, 256),
    ("B64_56x56_64-64-64", 64, 64, 56, 64, 64),
    ("B64_28x28_128-128-512", 64, 128, 28, 128, 512),
    ("B64_28x28_128-128-128", 64, 128, 28, 128, 128),
]
MLP_BATCHES = [65536, 262144]
# kfuse.compile's tune mode for every kfuse compile of the bench (``--tune``): with "fast" the
# unfused plan's GEMM / conv kernels are tuned as well, so fused is decided against unfused
# with both tuned (issue 5); "none" was the bench's mode before session 8
TUNE = "none"
SMOKE_GEMM = ([37], [(32, 32, 32), (16, 64, 24)])
SMOKE_CONV = [("B2_7x7_8-16-24", 2, 8, 7, 16, 24)]
SMOKE_MLP = [5]


def _log(msg: str) -> None:
    print(msg, flush=True)


def _kfuse_times(model: nn.Module, x: torch.Tensor, rep: int, calls: int = 1, **opts: Any) -> tuple[float, float, Any, Any]:
    """(graph-captured plan ms per call, plain call ms, output, compiled model). The graph holds
    ``calls`` back-to-back calls (``graph_ms_per_call``), as the eager_cudagraph baseline."""
    c = kfuse.compile(model, (x,), cuda_graphs=False, tune=TUNE, **opts)
    with torch.no_grad():
        out = c(x)
        call_ms = time_ms(lambda: c(x), warmup=3, rep=rep)
        graph_ms = call_ms
        if x.is_cuda:
            try:
                graph_ms, out = graph_ms_per_call(c, (x,), calls=calls, rep=rep)
            except Exception as e:  # capture problems are reported, the plain call still counts
                _log(f"  kfuse CUDA-graph capture failed: {type(e).__name__}: {e}")
    return graph_ms, call_ms, out, c


def _one_call_graph_ms(c: Any, x: torch.Tensor, rep: int) -> float:
    """The compiled plan timed as one call per graph replay (the method before session 5)."""
    if not x.is_cuda:
        return float("nan")
    with torch.no_grad():
        return graph_ms_per_call(c, (x,), calls=1, rep=rep)[0]


def _paired_ms(c: Any, u_c: Any, x: torch.Tensor, rep: int, calls: int, rounds: int = 2) -> dict[str, Any]:
    """Both plans timed after both compiles, interleaved A B B A (A = b2b on), ``rounds`` times:
    the medians and every timing. Sessions 15-16 (H200, M = 1M, 256 -> 256 -> 256): the plan timed
    right after its own compile measured 2.4-7.7% slower than the ``fuse_b2b=False`` plan timed
    after it, with the same two kernels in both; timed side by side after both compiles they agree."""

    def one(m: Any) -> float:
        with torch.no_grad():
            if x.is_cuda:
                return graph_ms_per_call(m, (x,), calls=calls, rep=rep)[0]
            return time_ms(lambda: m(x), warmup=1, rep=max(1, rep // 10))

    times: dict[str, list[float]] = {"kfuse": [], "unfused": []}
    for _ in range(rounds):
        for side in ("kfuse", "unfused", "unfused", "kfuse"):
            times[side].append(one(c if side == "kfuse" else u_c))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {**med, "times_ms": times}


def _apply_paired(
    args: argparse.Namespace, c: Any, u_c: Any, x: torch.Tensor, k_ms: float, u_ms: float
) -> tuple[float, float, dict[str, Any]]:  # fmt: skip
    """With ``--paired``: the paired times replace the sequential ones (kept in the record)."""
    if not args.paired:
        return k_ms, u_ms, {}
    p = _paired_ms(c, u_c, x, args.rep, args.graph_calls)
    _log(f"  paired (A B B A after both compiles): kfuse {p['kfuse']:.4f} ms, unfused {p['unfused']:.4f} ms "
         f"(sequential {k_ms:.4f} / {u_ms:.4f})")  # fmt: skip
    extra = {"kfuse_sequential_ms": k_ms, "kfuse_unfused_sequential_ms": u_ms, "paired_times_ms": p["times_ms"],
             "timing_order": "paired: both plans after both compiles, A B B A x 2, medians"}  # fmt: skip
    return p["kfuse"], p["unfused"], extra


def _kfuse_and_unfused(
    args: argparse.Namespace, model: nn.Module, x: torch.Tensor, ref: Any, **opts: Any
) -> tuple[float, Any, Any, Any, dict[str, Any]]:
    """kfuse (``opts``) and the ``fuse_b2b=False`` plan on ``x``, as every section times them: the
    kfuse time (paired with ``--paired``), its output, both compiled models, and the record fields
    they share (plain-call, one-call-graph and unfused times, the unfused error against ``ref``)."""
    k_ms, call_ms, out, c = _kfuse_times(model, x, args.rep, args.graph_calls, **opts)
    k1_ms = _one_call_graph_ms(c, x, args.rep)
    u_ms, _, u_out, u_c = _kfuse_times(model, x, args.rep, args.graph_calls, fuse_b2b=False)
    k_ms, u_ms, paired = _apply_paired(args, c, u_c, x, k_ms, u_ms)
    fields = dict(kfuse_call_ms=call_ms, kfuse_unfused_ms=u_ms, unfused_max_rel_err=max_rel_err(u_out, ref),
                  kfuse_1call_graph_ms=k1_ms, graph_calls=args.graph_calls, **_b2b_fields(c), **paired)  # fmt: skip
    return k_ms, out, c, u_c, fields


def _b2b_fields(c: Any) -> dict[str, Any]:
    rep = c.report.get("b2b", {"fused": [], "not_fused": []})
    fused = rep["fused"]
    used = [f for f in fused if f.get("fused", True)]
    return {
        "tune": TUNE,
        "fused": bool(used),
        "residence": used[0]["residence"] if used else "none",
        "b2b_chains": fused,
        "b2b_not_fused": rep["not_fused"],
    }


def _baselines(
    fn: nn.Module, x: torch.Tensor, autotune: bool, rep: int, smoke: bool, calls: int = 1
) -> tuple[dict[str, float], dict[str, Any], list[str], dict[str, float]]:
    """PyTorch baselines; eager_cudagraph is re-timed with ``calls`` calls per graph (the single
    replay time is returned as ``eager_cudagraph_1call_ms``), on the footing of kfuse_ms."""
    extra: dict[str, float] = {}
    which = ["eager"] if smoke else ["eager", "eager_cudagraph", "compile"] + (["max_autotune"] if autotune else [])
    notes = [] if autotune or smoke else ["max_autotune skipped for this case (compile time within the 180 s budget)"]
    with torch.no_grad():
        times, outs, _ = pytorch_baselines(fn, (x,), which=which, rep=rep, log=_log)
        if calls > 1 and "eager_cudagraph" in times:
            one = times["eager_cudagraph"]
            times["eager_cudagraph"], _ = graph_ms_per_call(fn, (x,), calls=calls, rep=rep)
            extra["eager_cudagraph_1call_ms"] = one
            notes.append(
                f"eager_cudagraph and kfuse_ms: {calls} calls per CUDA graph, ms per call"
                " (one-call times: eager_cudagraph_1call_ms, kfuse_1call_graph_ms)"
            )
            _log(f"  eager_cudagraph x{calls} {times['eager_cudagraph']:9.4f} ms per call")
    return times, outs, notes, extra


def _mlp2(k0: int, n0: int, n1: int, dtype: torch.dtype, device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(k0, n0), nn.ReLU(), nn.Linear(n0, n1)).to(device=device, dtype=dtype).eval()


def bench_gemm(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    ms, widths = SMOKE_GEMM if args.smoke else (GEMM_M, GEMM_WIDTHS)
    cases = [(m, w) for m in ms for w in widths] + ([] if args.smoke else GEMM_WIDE)
    if args.gemm_cases:  # "M:K0xN0xN1,..."
        cases = [(int(m), tuple(int(v) for v in w.split("x"))) for m, w in (c.split(":") for c in args.gemm_cases.split(","))]
    recs = []
    deadline = time.perf_counter() + SECTION_S["gemm"] * args.budget_scale
    for m, (k0, n0, n1) in cases:
        case = f"M{m}_{k0}x{n0}x{n1}"
        if time.perf_counter() > deadline:
            _log(f"[b2b_gemm] {case} skipped: section time budget used up")
            continue
        _log(f"[b2b_gemm] {case}")
        try:
            model = _mlp2(k0, n0, n1, dtype, device)
            x = torch.randn(m, k0, device=device, dtype=dtype)
            autotune = (m, (k0, n0, n1)) in AUTOTUNE_CASES and not args.no_autotune
            base, outs, notes, extra = _baselines(model, x, autotune, args.rep, args.smoke, args.graph_calls)
            ref = outs.get("eager")
            k_ms, out, c, u_c, fields = _kfuse_and_unfused(args, model, x, ref, b2b_pdl=args.pdl)
            flops = 2.0 * m * (k0 * n0 + n0 * n1)
            nbytes = 2.0 * (m * (k0 + n1) + k0 * n0 + n0 * n1 + n0 + n1)
            rec = make_record(
                "b2b_gemm", case, k_ms, base, floor_ms(flops, nbytes), max_rel_err(out, ref), args.command, "fp16",
                **fields, **extra, m=m, widths=[k0, n0, n1], notes=notes,
                kernels=kernel_lines(c.report), unfused_kernels=kernel_lines(u_c.report),
            )  # fmt: skip
            recs.append(rec)
            _log(f"  kfuse {k_ms:.4f} ms (call {fields['kfuse_call_ms']:.4f}), unfused kfuse {fields['kfuse_unfused_ms']:.4f} ms, "
                 f"fused={rec['fused']} {rec['residence']}")  # fmt: skip
        except Exception as e:  # one failing case does not stop the others
            _log(f"  FAILED {case}: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")
    return recs


def _convs(cin: int, c0: int, c1: int, dtype: torch.dtype, device: str) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(cin, c0, 3, padding=1), nn.ReLU(), nn.Conv2d(c0, c1, 1), nn.ReLU())
    return m.to(device=device, dtype=dtype, memory_format=torch.channels_last).eval()


def bench_conv(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    recs = []
    deadline = time.perf_counter() + SECTION_S["conv"] * args.budget_scale
    for case, nb, cin, hw, c0, c1 in SMOKE_CONV if args.smoke else CONV_CASES:
        if time.perf_counter() > deadline:
            _log(f"[b2b_conv] {case} skipped: section time budget used up")
            continue
        _log(f"[b2b_conv] {case}")
        try:
            model = _convs(cin, c0, c1, dtype, device)
            x = torch.randn(nb, cin, hw, hw, device=device, dtype=dtype).to(memory_format=torch.channels_last)
            base, outs, notes, extra = _baselines(model, x, False, args.rep, args.smoke, args.graph_calls)
            ref = outs.get("eager")
            k_ms, out, c, u_c, fields = _kfuse_and_unfused(args, model, x, ref, profile=not args.smoke)
            # where the plan's time goes (each step replayed alone from a CUDA graph)
            steps = [{k: r[k] for k in ("kernel", "template", "ops", "time_ms")} for r in (c.variant.profile or [])]
            if steps:
                _log("  plan: " + ", ".join(f"{r['kernel']} [{r['template']}] {r['time_ms']:.4f}" for r in steps))
            pix = nb * hw * hw
            flops = 2.0 * pix * (9 * cin * c0 + c0 * c1)
            nbytes = 2.0 * (pix * (cin + c1) + 9 * cin * c0 + c0 * c1)
            rec = make_record(
                "b2b_conv", case, k_ms, base, floor_ms(flops, nbytes), max_rel_err(out, ref), args.command, "fp16",
                **fields, **extra, plan_profile=steps,
                baseline_note="eager = cuDNN (channels-last); kfuse_unfused_ms = two conv_epilogue kernels (fuse_b2b=False)",
                notes=notes + ["max_autotune skipped for conv chains"],
                kernels=kernel_lines(c.report), unfused_kernels=kernel_lines(u_c.report),
            )  # fmt: skip
            recs.append(rec)
            _log(f"  kfuse {k_ms:.4f} ms, unfused kfuse {fields['kfuse_unfused_ms']:.4f} ms, fused={rec['fused']} {rec['residence']}")
        except Exception as e:
            _log(f"  FAILED {case}: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")
    return recs


def bench_mlp(args: argparse.Namespace, device: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    import kfuse.models as zoo

    recs = []
    deadline = time.perf_counter() + SECTION_S["mlp"] * args.budget_scale
    for batch in SMOKE_MLP if args.smoke else MLP_BATCHES:
        case = f"nerf-mlp_B{batch}"
        if time.perf_counter() > deadline:
            _log(f"[mlp_model] {case} skipped: section time budget used up")
            continue
        _log(f"[mlp_model] {case}")
        try:
            model, margs, _ = zoo.build("nerf-mlp", batch=batch, dtype=dtype, device=device)
            x = margs[0]
            base, outs, notes, extra = _baselines(model, x, False, args.rep, args.smoke, args.graph_calls)
            ref = outs.get("eager")
            k_ms, out, _, _, fields = _kfuse_and_unfused(args, model, x, ref)
            flops = 2.0 * batch * (63 * 256 + 7 * 256 * 256 + 256 * 4)
            nbytes = 2.0 * (batch * (63 + 4) + 63 * 256 + 7 * 256 * 256 + 256 * 4)
            rec = make_record(
                "mlp_model", case, k_ms, base, floor_ms(flops, nbytes), max_rel_err(out, ref), args.command, "fp16",
                **fields, **extra, notes=notes,
            )  # fmt: skip
            recs.append(rec)
            _log(f"  kfuse {k_ms:.4f} ms, unfused kfuse {fields['kfuse_unfused_ms']:.4f} ms, fused={rec['fused']} {rec['residence']}")
        except Exception as e:
            _log(f"  FAILED {case}: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")
    return recs


def _table(recs: list[dict[str, Any]]) -> None:
    head = ["benchmark", "case", "kfuse", "unfused", "best base", "speedup", "floor", "fused", "res", "err"]
    _log(f"{head[0]:10s} {head[1]:26s} " + " ".join(f"{h:>9s}" for h in head[2:]))
    nan = float("nan")
    for r in recs:
        base = min(r["baselines_ms"].values()) if r["baselines_ms"] else nan
        nums = [r["kfuse_ms"], r.get("kfuse_unfused_ms", nan), base, r.get("speedup_vs_best", nan), r["floor_ms"]]
        _log(
            f"{r['benchmark']:10s} {r['case']:26s} "
            + " ".join(f"{v:9.4f}" for v in nums)
            + f" {str(r['fused']):>9s} {r['residence']:>9s} {r['max_rel_err']:9.2g}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (interpreter), eager baseline only")
    ap.add_argument("--only", default="gemm,conv,mlp", help="comma list of gemm, conv, mlp")
    ap.add_argument("--tune", default="none", choices=["none", "fast", "full"], help="kfuse.compile's tune mode (both plans)")
    ap.add_argument("--no-autotune", action="store_true", help="skip max-autotune everywhere")
    ap.add_argument("--rep", type=int, default=30)
    ap.add_argument("--pdl", action="store_true", help="GEMM chains: also measure programmatic dependent launch (Options.b2b_pdl)")
    ap.add_argument("--graph-calls", type=int, default=20, help="back-to-back calls per CUDA graph for kfuse and eager_cudagraph")
    ap.add_argument("--gemm-cases", default="", help="GEMM chains to run instead of the matrix, e.g. 262144:64x1024x64,1048576:256x256x256")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="time kfuse and the fuse_b2b=False plan side by side after both compiles (A B B A x 2); kfuse_ms is that median",
    )
    ap.add_argument("--budget-scale", type=float, default=1.0, help="scale the per-section time budgets (default 175 s in all)")
    args = ap.parse_args()
    args.command = "PYTHONPATH=. python benchmarks/b2b_bench.py " + " ".join(sys.argv[1:])
    global TUNE
    TUNE = args.tune
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32  # the interpreter: fp32 on the CPU
    if args.smoke:
        args.rep = 2
    t0 = time.perf_counter()
    all_recs = []
    for name, fn, file in [("gemm", bench_gemm, "b2b_gemm"), ("conv", bench_conv, "b2b_conv"), ("mlp", bench_mlp, "mlp_model")]:
        if name not in args.only.split(","):
            continue
        recs = fn(args, device, dtype)
        if recs:
            path = write_results(file, recs, args.out)
            _log(f"wrote {path} ({len(recs)} records) at {time.perf_counter() - t0:.0f} s")
        all_recs += recs
    _table(all_recs)


if __name__ == "__main__":
    main()
