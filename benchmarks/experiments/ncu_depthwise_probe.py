"""Hardware counters (Nsight Compute) of the depthwise kernels against cuDNN: why the rows kernel lost.

Session 38 (``experiments/s38_depthwise_probe_run{1,2_prefetch}.json``): at ConvNeXt-T's 7x7 stage 1
(B32, 56 x 56 x 96, fp16) the rows kernel (each input row loaded once per program, a ring of 7 output rows)
took 98-117 us. The taps kernel (every tap loaded, mostly from L1) took 83.5 us and cuDNN + bias 91.2.
ptxas had promised the opposite: about 81 instructions an output against 197, and 7 input loads against
49. Prefetching the next row changed -6..+3%, so one row's load latency is not the cause.
Prediction, if parallelism is what is missing: the rows kernel shows low achieved occupancy (few warps an SM:
144 registers, 64-thread programs), a high share of stalls on dependencies or "not selected / no instruction"
at low issue activity, and L1 / L2 throughput far from peak. If instead the weight loads are the cost (98
LDGs a step per thread for 392 FFMAs), stalls on the LSU / L1 ("lg throttle", "mio throttle") dominate.

The script runs itself under ``ncu`` (``--clock-control none``; SpeedOfLight, MemoryWorkloadAnalysis,
WarpStateStats, Occupancy, LaunchStats), profiling one call of each kernel after warm-up, and writes the
numbers per layer and kernel.

    PYTHONPATH=. python benchmarks/experiments/ncu_depthwise_probe.py --out $OUT   # H200, ~60 s
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from ncu_calls import find_ncu, profile_calls, read_raw  # a sibling: the script's folder is sys.path[0]

# (name, batch, channels, height/width, kernel): ConvNeXt's first and last stage, MobileNet-V2's 112 x 112 x 32
LAYERS = [("convnext_s1", 32, 96, 56, 7), ("convnext_s4", 32, 768, 7, 7), ("mbv2_112_c32", 32, 32, 112, 3)]
# what was timed in session 38: the taps kernel at its rule's tile, the rows kernel at its rule's tile
KERNELS = [("taps", None), ("rows", None), ("rows 14 rows", (16, 32, 14, 2))]
KEEP = (
    "gpu__time_duration.sum", "sm__throughput.avg.pct", "l1tex__throughput.avg.pct", "lts__throughput.avg.pct",
    "dram__throughput.avg.pct", "l1tex__t_sector_hit_rate.pct", "lts__t_sector_hit_rate.pct", "sm__warps_active",
    "launch__registers_per_thread", "launch__grid_size", "launch__block_size", "launch__occupancy_limit",
    "smsp__inst_executed.sum", "smsp__issue_active", "smsp__average_warp", "smsp__pcsamp_warps_issue_stalled",
    "sm__maximum_warps", "achieved_occupancy", "gpc__cycles_elapsed.avg.per_second",
)  # fmt: skip


def child() -> None:
    """Warm every kernel up, check it against F.conv2d, then run each once between cudaProfilerStart / Stop."""
    import torch
    import torch.nn.functional as F

    from kfuse.kernels.depthwise import depthwise_conv2d, pack_rows_weight

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    calls = []
    for name, nb, c, hw, k in LAYERS:
        x = torch.randn(nb, c, hw, hw, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
        w = (torch.randn(c, 1, k, k, device="cuda", dtype=torch.float16) / k).contiguous(memory_format=torch.channels_last)
        b = torch.randn(c, device="cuda", dtype=torch.float16)
        wp = pack_rows_weight(w)
        want = F.conv2d(x, w, b, 1, k // 2, 1, c)
        calls.append((name, "cudnn + bias", lambda x=x, w=w, b=b, k=k, c=c: F.conv2d(x, w, b, 1, k // 2, 1, c), None))
        for label, cfg in KERNELS:
            kind = label.split()[0]
            out = torch.empty_like(want)
            fn = lambda x=x, w=w, b=b, k=k, out=out, kind=kind, cfg=cfg, wp=wp: depthwise_conv2d(  # noqa: E731
                x, w, b, 1, k // 2, 1, out=out, config=cfg, kernel=kind, packed_weight=wp)  # fmt: skip
            calls.append((name, label, fn, (out, want)))
    profile_calls(calls, lambda gw: f"max_abs_err {float((gw[0].float() - gw[1].float()).abs().max()):.2e}")


def label_by_launch_order(order: list, recs: list[dict]) -> None:
    """Tie each profiled kernel to the call that launched it: a kfuse call launches one ``_depthwise`` kernel,
    cuDNN's call every other kernel up to the next one (the conv, then the bias add: session 39's run had 15
    kernels for 12 calls and was left unlabelled)."""
    j = 0
    for layer, label in order:
        if label.startswith("cudnn"):
            while j < len(recs) and not recs[j]["kernel"].startswith("_depthwise"):
                recs[j].update(layer=layer, variant=label)
                j += 1
        elif j < len(recs):
            recs[j].update(layer=layer, variant=label)
            j += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        child()
        return
    from kfuse.bench.harness import write_experiment

    ncu = find_ncu()
    if ncu is None:
        write_experiment("ncu_depthwise_probe", args.out, error="ncu not found")
        print("ncu not found")
        return
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
           "--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis", "--section", "WarpStateStats",
           "--section", "LaunchStats", "--section", "Occupancy", sys.executable, __file__, "--child"]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    order, checks, _, rows = read_raw(r.stdout)
    keep = [k for k in (rows[0].keys() if rows else []) if any(s in k for s in KEEP)]
    recs = [{"kernel": x.get("Kernel Name", ""), **{k: x[k] for k in keep}} for x in rows]
    label_by_launch_order(order, recs)
    write_experiment("ncu_depthwise_probe", args.out, command=" ".join(cmd), records=recs, order=order, checks=checks,
                     stderr_tail=r.stderr[-3000:], rc=r.returncode)  # fmt: skip
    print("\n".join(checks))
    if r.returncode:
        print(r.stderr[-3000:])

    def pick(x: dict, *subs: str) -> str:
        return next((v for k, v in x.items() if all(s in k for s in subs)), "-")

    cols = [("us", "gpu__time_duration.sum"), ("SM%", "sm__throughput.avg.pct"), ("L1%", "l1tex__throughput.avg.pct"),
            ("L2%", "lts__throughput.avg.pct"), ("L1hit", "l1tex__t_sector_hit_rate.pct"), ("warps", "sm__warps_active"),
            ("regs", "launch__registers_per_thread"), ("issue", "smsp__issue_active.avg.per_cycle_active"),
            ("lgSB", "stalled_long_scoreboard_per_issue_active")]  # fmt: skip
    print(f"{'layer':14s} {'variant':14s} {'kernel':28s} " + " ".join(f"{c:>7s}" for c, _ in cols))
    for x in recs:
        vals = " ".join(f"{pick(x, m)[:7]:>7s}" for _, m in cols)
        print(f"{x.get('layer', '?'):14s} {x.get('variant', '?'):14s} {x['kernel'][:28]:28s} {vals}")


if __name__ == "__main__":
    main()
