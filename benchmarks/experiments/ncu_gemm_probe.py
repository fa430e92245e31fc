"""Hardware counters (Nsight Compute) of kfuse's ping-pong GEMM against cuBLAS on issue 3's shapes:
what bounds the last 4-15%.

Session 20 (``experiments/s20_ncu_gemm_probe.json``): kfuse's bias + GELU kernel took as many cycles as
cuBLAS's bare GEMM at T16384 ffn1 (186.0k against 185.0k) but ran at 1.465 GHz against 1.537: the
GPU is at its power limit and kfuse moves 1.48x cuBLAS's L2 bytes (the prediction below held for the
bytes, 75% of L2 peak against 44%; the time gap is the clock). Variants since: the bias folded into
the accumulator, the 192 x 128 tile and shared staging (``ws_power_probe.py``).

Session 19 left kfuse's bias + GELU GEMM at 1.04-1.15x the bare cuBLAS GEMM (one call a replay). cuBLAS
runs 256x128 / 192x192 tiles in 2-CTA clusters with TMA multicast (``cublas_kernel_names.py``); kfuse
runs 128x128 ping-pong without clusters. Per 128 x 128 x 64 K step a kfuse program loads 32 KB of
operands from L2 for 1 M MACs (32 B a clock at the tensor cores' peak of 1,024 MACs a clock per SM:
7.7 TB/s over 132 SMs at 1.83 GHz); a 256 x 128 tile whose B block is multicast to two CTAs needs
40 KB for 2 M MACs (20 B a clock). Prediction, if the operand traffic is what bounds kfuse: kfuse's L2
throughput is well above cuBLAS's for the same work (~1.5x the bytes), near its ceiling (> 80% of
peak), and its tensor-pipe activity is below cuBLAS's by about the time gap. If instead the L2 is
not near its ceiling, the gap is in issue (the wgmma stream, waits, the epilogue).

The script runs itself under ``ncu`` (``--clock-control none``, sections SpeedOfLight,
MemoryWorkloadAnalysis, ComputeWorkloadAnalysis, WarpStateStats, plus any tensor-pipe metrics the
installed ncu knows), profiling one call of each kernel after warm-up, and writes the numbers per
kernel and shape.

    PYTHONPATH=. python benchmarks/experiments/ncu_gemm_probe.py --out $OUT   # H200, ~90 s
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from ncu_calls import find_ncu, profile_calls, read_raw  # a sibling: the script's folder is sys.path[0]

SHAPES = {  # case: (M, K, N)
    "bert_T16384_ffn1": (16384, 768, 3072),
    "bert_T4096_ffn1": (4096, 768, 3072),
    "gpt2_T8192_ffn2": (8192, 3072, 768),
}
# kfuse variants: (label, schedule, block_m, block_n, stages, group_m, epilogue, shared staging, bias mode)
VARIANTS = [
    ("pingpong 128x128 s5 bias+gelu", "pingpong", 128, 128, 5, 8, "bias_gelu", False, "epilogue"),
    ("pingpong 128x128 s5 bare", "pingpong", 128, 128, 5, 8, "bare", False, "epilogue"),
    ("pingpong 192x128 s4 sc bias+gelu", "pingpong", 192, 128, 4, 8, "bias_gelu", True, "epilogue"),
    ("pingpong 128x128 s6 sc bias+gelu", "pingpong", 128, 128, 6, 8, "bias_gelu", True, "epilogue"),
    ("coop 128x256 s4 bare", "coop", 128, 256, 4, 8, "bare", False, "epilogue"),
]
# ``--set t4096`` (session 21): the shapes where a program holds one to four 192 x 128 tiles, so its last
# epilogue is not overlapped; the tuned kernel with and without its epilogue, and the blocked bias load
SETS = {
    "t4096": (
        {"bert_T4096_attn_out": (4096, 768, 768), "bert_T4096_ffn2": (4096, 3072, 768), "bert_T4096_qkv": (4096, 768, 2304)},
        [
            ("pingpong 192x128 s4 g1 sc bias+gelu", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "epilogue"),
            ("pingpong 192x128 s4 g1 sc blocked", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "blocked"),
            ("pingpong 192x128 s4 g1 sc tma", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "tma"),
            ("pingpong 192x128 s4 g1 sc bare", "pingpong", 192, 128, 4, 1, "bare", True, "epilogue"),
        ],
    ),
    # session 21: the rows kernel (two warpgroups on one tile) is the fastest without an epilogue, and slower
    # than ping-pong with it, also with an epilogue warpgroup beside its main loop: cycles or clock?
    # (experiments/s21_ncu_gemm_probe_rows.json: cycles, at the same clock)
    "rows": (
        {"bert_T16384_qkv": (16384, 768, 2304), "gpt2_T8192_ffn1": (8192, 768, 3072)},
        [
            ("pingpong 192x128 s4 g1 sc bias+gelu", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "epilogue"),
            ("pingpong 192x128 s4 g1 sc bare", "pingpong", 192, 128, 4, 1, "bare", True, "epilogue"),
            ("rows 192x128 s4 g1 bias+gelu", "rows", 192, 128, 4, 1, "bias_gelu", False, "epilogue"),
            ("rows 192x128 s4 g1 bare", "rows", 192, 128, 4, 1, "bare", False, "epilogue"),
            # run 1 also profiled the rows kernel with an epilogue warpgroup (commit f2cb384, removed since)
        ],
    ),
    # session 30: the one-tile shape with the GELU on f16x2 pairs, its bias row loaded in the epilogue or
    # prefetched before the turn wait (``bias_mode="prefetch"``), and bare; with ``--source`` the SASS source
    # page (stall samples per instruction) says where the exposed epilogue's time goes
    "s30": (
        {"bert_T4096_attn_out": (4096, 768, 768)},
        [
            ("pingpong 192x128 s4 g1 sc g16", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "epilogue", True),
            ("pingpong 192x128 s4 g1 sc pre g16", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "prefetch", True),
            ("pingpong 192x128 s4 g1 sc bare", "pingpong", 192, 128, 4, 1, "bare", True, "epilogue", False),
        ],
    ),
    # session 31: the same shape with half the GELU's values on the FMA pipe (gelu_mix, launch's default there):
    # where the ~1.2 us the exposed epilogue still costs over the bare kernel goes
    "s31": (
        {"bert_T4096_attn_out": (4096, 768, 768)},
        [
            ("pingpong 192x128 s4 g1 sc pre g16", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "prefetch", True, False),
            ("pingpong 192x128 s4 g1 sc pre mix", "pingpong", 192, 128, 4, 1, "bias_gelu", True, "prefetch", True, True),
            ("pingpong 192x128 s4 g1 sc bare", "pingpong", 192, 128, 4, 1, "bare", True, "epilogue", False, False),
        ],
    ),
}
TENSOR_METRIC_HINTS = (
    "sm__pipe_tensor_op_gmma_cycles_active",
    "sm__inst_executed_pipe_tensor_op_gmma",
    "sm__pipe_tensor_op_hmma_cycles_active",
)
EXTRA_METRICS = [
    "lts__t_bytes.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "dram__bytes_read.sum",
    "sm__cycles_active.avg",
    "smsp__inst_executed.sum",
]


def child(which: str | None) -> None:
    """Warm every kernel up, then run each once between cudaProfilerStart / Stop, in a known order."""
    import torch

    from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
    from kfuse.kernels import gemm_ws
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
    from kfuse.kernels.gemm import prepare
    from kfuse.kernels.gemm_ws import WsConfig

    add = EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))
    epis = {"bare": Epilogue((), 0), "bias_gelu": Epilogue((add, EpilogueStep("gelu", (Operand("reg", 1),))), 1)}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    calls = []
    shapes, variants = SETS[which] if which else (SHAPES, VARIANTS)
    for case, (m, k, n) in shapes.items():
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = (torch.randn(n, k, device="cuda") / k**0.5).half()
        b = w.t().contiguous()
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        ref = a.float() @ b.float()
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        calls.append((case, "cublas mm", lambda a=a, b=b, out=out: torch.mm(a, b, out=out), None))
        for label, sched, bm, bn, st, gm, epi, shared, mode, *g16 in variants:
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            g = prepare(a, b, [] if epi == "bare" else [bias], torch.float16, c)
            cfg = WsConfig(sched, bm, bn, 64, st, gm, 1, shared)  # coop: one staging buffer (s4 fits only so)
            gelu16, mix = (list(g16) + [False, False])[:2]  # optional trailing fields: gelu16, gelu_mix
            mod = gemm_ws.module(epis[epi], fast_gelu=True, bias_mode=mode, gelu16=bool(gelu16), gelu_mix=bool(mix))
            fn = lambda g=g, cfg=cfg, mod=mod: gemm_ws.run_module(mod, g.a, g.b, g.c, g.extras, cfg, sms)  # noqa: E731
            want = ref if epi == "bare" else torch.nn.functional.gelu(ref + bias.float(), approximate="tanh")
            calls.append((case, label, fn, (c, want)))
    profile_calls(calls, lambda gw: f"rel_err {float((gw[0].float() - gw[1]).abs().max() / gw[1].abs().max()):.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--set", choices=sorted(SETS), help="another set of shapes and variants (default: session 20's)")
    ap.add_argument("--source", action="store_true", help="stall samples per SASS instruction: the source pages")
    args = ap.parse_args()
    if args.child:
        child(args.set)
        return
    from kfuse.bench.harness import write_experiment

    name = "ncu_gemm_probe" + (f"_{args.set}" if args.set else "")
    ncu = find_ncu()
    if ncu is None:
        write_experiment(name, args.out, error="ncu not found")
        print("ncu not found")
        return
    q = subprocess.run([ncu, "--query-metrics", "--chip", "gh100"], capture_output=True, text=True)
    known = q.stdout
    tensor = [h for h in TENSOR_METRIC_HINTS if h in known]
    metric_args = [m for m in EXTRA_METRICS if m.split(".")[0] in known]
    metric_args += [f"{t}.avg.pct_of_peak_sustained_active" for t in tensor if "cycles_active" in t]
    metric_args += [f"{t}.sum" for t in tensor if "inst_executed" in t]
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
           "--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis", "--section", "ComputeWorkloadAnalysis",
           "--section", "WarpStateStats", "--section", "LaunchStats", "--section", "Occupancy"]  # fmt: skip
    if metric_args:
        cmd += ["--metrics", ",".join(metric_args)]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    rep = os.path.join(args.out or ".", f"{name}.ncu-rep")
    if args.source:  # a report file instead of the printed page (ncu takes one or the other), read back below
        cmd = [x for x in cmd if x not in ("--csv", "--page", "raw")] + ["--section", "SourceCounters", "-f", "--export", rep]
    cmd += [sys.executable, __file__, "--child"] + (["--set", args.set] if args.set else [])
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if args.out:  # what ncu said, whatever it was (session 30's first --source run failed silently)
        with open(os.path.join(args.out, f"{name}_ncu_stdout.txt"), "w") as f:
            f.write(r.stdout[-20000:] + "\n--- stderr ---\n" + r.stderr[-5000:])
    if args.source and os.path.exists(rep):  # with --export, ncu prints no page: read the raw one back
        raw = subprocess.run([ncu, "-i", rep, "--csv", "--page", "raw"], capture_output=True, text=True)
        r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout + "\n" + raw.stdout, r.stderr + raw.stderr)
    order, checks, body, rows = read_raw(r.stdout)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{name}_raw.csv"), "w") as f:
            f.write(body)
    keep = [k for k in (rows[0].keys() if rows else []) if any(s in k for s in (
        "gpu__time_duration.sum", "sm__throughput.avg.pct", "gpu__compute_memory_throughput.avg.pct", "lts__throughput.avg.pct",
        "l1tex__throughput.avg.pct", "dram__throughput.avg.pct", "lts__t_bytes.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
        "dram__bytes_read.sum", "sm__cycles_active.avg", "smsp__inst_executed.sum", "tensor", "gpc__cycles_elapsed.max",
        "smsp__cycles_active.avg", "sm__warps_active", "smsp__average_warp", "lts__t_sector_hit_rate", "launch__registers",
        "launch__grid_size", "launch__cluster", "smsp__pcsamp", "sm__inst_executed_pipe", "smsp__issue_active",
        "gpc__cycles_elapsed.avg.per_second", "stall"))]  # fmt: skip
    # the profiled kernels in launch order; a cuBLAS call may launch a memset first
    names = [x.get("Kernel Name", "") for x in rows]
    recs = []
    gemm_rows = [x for x in rows if "memset" not in x.get("Kernel Name", "").lower() and "fill" not in x.get("Kernel Name", "").lower()]
    for (case, label), x in zip(order, gemm_rows, strict=False):
        recs.append({"case": case, "variant": label, "kernel": x.get("Kernel Name", ""), **{k: x[k] for k in keep}})
    if args.source and os.path.exists(rep):  # the source pages of every profiled kernel, in launch order
        src = subprocess.run([ncu, "-i", rep, "--page", "source", "--csv", "--print-source", "sass"], capture_output=True, text=True)
        with open(os.path.join(args.out or ".", f"{name}_source.csv"), "w") as f:
            f.write(src.stdout + src.stderr[-2000:])
        os.remove(rep)  # large; the pages are what is kept
    write_experiment(name, args.out, command=" ".join(cmd), records=recs, checks=checks, kernel_names=names,
                     stderr_tail=r.stderr[-3000:], tensor_metrics=tensor, rc=r.returncode)  # fmt: skip
    print("\n".join(checks))
    if r.returncode:
        print(r.stderr[-3000:])
    print(f"{'case':18s} {'variant':30s} {'us':>7s} {'SM%':>5s} {'L2%':>5s} {'DRAM%':>6s} {'L2 GB':>7s} {'tensor%':>8s} {'MHz':>6s}")

    def pick(x: dict, *subs: str) -> str:
        for k, v in x.items():
            if all(s in k for s in subs):
                return v
        return "-"

    for x in recs:
        us = pick(x, "gpu__time_duration.sum")
        l2b = pick(x, "lts__t_bytes.sum")
        try:
            l2b = f"{float(l2b) / 1e9:.2f}"
        except ValueError:
            pass
        sm, l2, dram = pick(x, "sm__throughput.avg.pct"), pick(x, "lts__throughput.avg.pct"), pick(x, "dram__throughput.avg.pct")
        tc, hz = pick(x, "tensor", "pct"), pick(x, "gpc__cycles_elapsed.avg.per_second")
        print(f"{x['case']:18s} {x['variant']:30s} {us:>7s} {sm:>5s} {l2:>5s} {dram:>6s} {l2b:>7s} {tc:>8s} {hz:>6s}")


if __name__ == "__main__":
    main()
