"""Issue 8: a BE kernel run by a worker partition of the ping-pong GEMM (``kfuse.colocate.ws_partition``), beside
the GEMM in one launch, on BERT-base B8 S128's four GEMM shapes (M = 1024).

**Question.** Session 55: in a Triton fused kernel a BE block can share an SM with the plan's tuned GEMM tile only
if the tile gives up half its ring (the GEMMs 1.5x slower), and beside kfuse's tuned compiled LC neither a
partition nor a backfill gained anything (+0.0%). A Gluon worker partition gives the BE its own registers
(``setmaxnreg``) and leaves the GEMM its tile, ring and schedule. Does the BE then run beside the GEMM for free?

**Measured per shape and BE kernel** (CUDA-graph replays of 10 launches, ``kfuse.colocate.lc.gpu_time_ms``):
- ``lc_best``: the fastest of the solo GEMM kernels kfuse's tuner chooses among here (Triton TMA 64 x 128 x 128 s4
  and 128 x 128 x 64 s4, ping-pong 128 x 128 s4 and 128 x 192 s4 with shared staging), with the shape's epilogue;
- ``be_solo(S)``: the BE slice of ``S`` blocks a program (``S x P`` blocks) alone on the whole GPU, the fastest of
  the original launch and two persistent grids (what time sharing runs);
- ``fused(S)``: the ping-pong GEMM (``FUSED``: 128 x 128 s4, 128 x 192 s4 with the loader on 24 registers, 64 x 128 s6)
  with the BE partition (4 warps; ``--warps 4,8`` adds each host with 8) running that slice;
- ``overlap(S) = (lc_best + be_solo - fused) / (lc_best + be_solo)`` (Aker's rate, against the best solo GEMM) and
  ``be_free(S) = 1 - (fused - lc_best) / be_solo``: the share of the slice's solo GPU time the fusion saves.
Correctness in the same run: the fused launch with the whole BE kernel (every block) against both references,
the GEMM output poisoned and the BE output reset first.

Prediction (before the run): the GEMM beside an idle partition within 3% of the ping-pong 128 x 128 kernel alone
(208 registers for its consumers instead of 232-240, no spills offline), the best solo kernel 0-10% faster than
that; a histogram block (2,048 inputs, ~6 us at four programs an SM solo) on one 4-warp partition an SM runs at
~1/4 of the solo rate, so a 10-20 us GEMM carries 1-3 blocks a program: ``overlap`` ~10-20% at small S, falling
once the slice outlasts the GEMM; mri-q (MUFU-bound, which wgmma leaves idle) similar or better.

    PYTHONPATH=. python benchmarks/experiments/ws_colocate_probe.py --out /tmp/wsp

Measured (session 56, an H100; docs/perf-notes.md): the 64 x 128 s6 host fastest on every row, 0-13% over the best
solo kernel; ``be_free`` 0.45-0.95 at one or two blocks a program for histogram, mri-q and stencil7.
Next (``--warps 4,8``): 8 BE warps (consumers 152-176 registers, enough for the 64 x 128 tile's 64 accumulator
registers) predicted to raise ``be_free`` at two or more blocks a program, where 4 warps leave the BE latency-bound
(histogram on ffn1: 0.56 at one block, 0.37 at four), and to change little at one.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from kfuse.colocate import workloads, ws_partition
from kfuse.colocate.lc import gpu_time_ms
from kfuse.colocate.ptb import launch_ptb, num_sms
from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue references
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import GemmConfig, gemm_epilogue, reference

ADD = EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))
BIAS = Epilogue((ADD,), 1)
BIAS_GELU = Epilogue((ADD, EpilogueStep("gelu", (Operand("reg", 1),))), 1)
SHAPES = {  # BERT-base B8 S128: name -> (M, N, K, epilogue)
    "qkv": (1024, 2304, 768, BIAS),
    "attn_out": (1024, 768, 768, BIAS),
    "ffn1": (1024, 3072, 768, BIAS_GELU),
    "ffn2": (1024, 768, 3072, BIAS),
}
SOLO = {  # the tuner's candidates for these shapes (docs/perf-notes.md, Session 55: the shipped H100 records)
    "tma 64x128x128 s4": GemmConfig(64, 128, 128, num_warps=4, num_stages=4, persistent=True, tma=True),
    "tma 128x128x64 s4": GemmConfig(128, 128, 64, num_warps=8, num_stages=4, persistent=True, tma=True),
    "pingpong 128x128x64 s4": GemmConfig(128, 128, 64, num_warps=4, num_stages=4, persistent=True, tma=True, ws="pingpong"),
    "pingpong 128x192x64 s4 sc": GemmConfig(
        128, 192, 64, num_warps=4, num_stages=4, persistent=True, tma=True, ws="pingpong", shared_c=True
    ),  # fmt: skip
}
# the ping-pong tiles that host the BE partition, and the loader warp's registers beside it: the experiment's hosts and
# the 128 x 192 tile, which spills beside a partition (offline: 108-207 stores)
FUSED = {name: (cfg, loader) for name, cfg, loader in (*ws_partition.HOST_TILES, ws_partition.PP192_HOST, ws_partition.PP64_K128_HOST)}


def be_solo_ms(work: workloads.Workload, blocks: int, sms: int) -> tuple[float, int]:
    """The slice's fastest solo time on the whole GPU and its grid (the original launch or a persistent one)."""
    best = (math.inf, 0)
    for grid in sorted({blocks, min(blocks, 2 * sms), min(blocks, 4 * sms), min(blocks, 8 * sms)}):
        t = gpu_time_ms(lambda g=grid: launch_ptb(work.kernel, 0, blocks, grid=g))
        best = min(best, (t, grid))
    return best


def probe_shape(name: str, be_names: list[str], slices: list[int], warps_list: list[int], dev: torch.device,
                unrolls: tuple[int, ...] = (1,), feeds: tuple[str, ...] = ("ldg",)) -> list[dict[str, Any]]:  # fmt: skip
    m, n, k, epi = SHAPES[name]
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dev, torch.float16)
    b = (torch.randn(k, n, generator=g) / math.sqrt(k)).to(dev, torch.float16)
    bias = torch.randn(n, generator=g).to(dev, torch.float16)
    row = bias.view(1, 1, n).expand(1, m, n)
    ref = reference(a, b, [bias.view(1, n).expand(m, n)], epi, torch.float16).float()
    c = torch.empty(1, m, n, device=dev, dtype=torch.float16)
    solo = {}
    for cname, cfg in SOLO.items():
        c.fill_(float("nan"))
        gemm_epilogue(a, b, [bias.view(1, n).expand(m, n)], epi, torch.float16, cfg, out=c[0])
        err = (c[0].float() - ref).abs().max().item() / ref.abs().max().item()
        t = gpu_time_ms(lambda cfg=cfg: gemm_epilogue(a, b, [bias.view(1, n).expand(m, n)], epi, torch.float16, cfg, out=c[0]))
        solo[cname] = {"ms": t, "err": err}
        print(f"{name:8s} solo {cname:28s} {t * 1e3:7.2f} us  err {err:.1e}", flush=True)
    ok = {k2: v for k2, v in solo.items() if v["err"] < 2e-2}
    best_name = min(ok, key=lambda k2: ok[k2]["ms"])
    lc_best = ok[best_name]["ms"]
    sms = num_sms(dev)
    a3, b3 = a.view(1, m, k), b.view(1, k, n)
    records = []
    for be in be_names:
        work = workloads.make(be, device=dev)
        hosts = {}
        # stencil7 also with several blocks an iteration (``--unroll``: U x the bytes in flight a BE thread) and fed by TMA
        # (``--feed tma``: a ring of the deepest ``TMA_SLOTS`` the host tile's shared memory leaves)
        forms = [(u, "ldg") for u in unrolls] if be == "stencil7" else [(1, "ldg")]
        forms = [f for f in forms if f[1] in feeds]
        forms += [(u, "tma") for u in unrolls if u in ws_partition.STENCIL7_TMA_REGS] if be == "stencil7" and "tma" in feeds else []
        variants = [((f"{h} w{w}" if len(warps_list) > 1 else h) + (f" u{u}" if u > 1 else "") + (" tma" if f == "tma" else ""),
                     cfg, loader, w, u, f, ws_partition.tma_slots(cfg, work.kernel.consts, u) if f == "tma" else 0)
                    for h, (cfg, loader) in FUSED.items() for w in warps_list for u, f in forms]  # fmt: skip
        for host, cfg, loader, warps, unroll, feed, slots in variants:
            if feed == "tma" and not slots:
                print(f"{name:8s} {host} + {be}: no TMA ring fits beside the tile's shared memory", flush=True)
                continue
            slots = slots or ws_partition.TMA_SLOTS[-1]  # the LDG form takes no ring
            try:
                part = ws_partition.for_workload(work, warps, unroll=unroll, feed=feed, slots=slots)
            except ValueError as e:
                print(f"{name:8s} {host} + {be}: {e}", flush=True)
                continue
            if unroll > 1 and part.consumer_regs() < ws_partition.MIN_CONSUMER_REGS:  # as WsHost.candidates
                print(f"{name:8s} {host} + {be}: leaves the consumers {part.consumer_regs()} registers", flush=True)
                continue
            # correctness: the whole BE kernel rides along with one GEMM launch
            work.reset()
            c.fill_(float("nan"))
            ws_partition.launch_fused(a3, b3, c, [row], epi, cfg, work, 0, work.kernel.n_blocks, sms, warps=warps, loader_regs=loader,
                                      unroll=unroll, feed=feed, slots=slots)  # fmt: skip
            torch.cuda.synchronize()
            gemm_err = (c[0].float() - ref).abs().max().item() / ref.abs().max().item()
            be_err = workloads.error(work)
            ok_both = gemm_err < 2e-2 and be_err <= max(work.tol, 1e-3)
            print(f"{name:8s} {host} + {be}: GEMM err {gemm_err:.1e}, {be} err {be_err:.1e} ({work.kernel.n_blocks} blocks)"
                  + ("" if ok_both else "  WRONG: not timed"), flush=True)  # fmt: skip
            if ok_both:
                hosts[host] = (cfg, loader, warps, unroll, feed, slots, gemm_err, be_err)
        for s in slices:
            blocks = min(s * sms, work.kernel.n_blocks)
            t_be, be_grid = be_solo_ms(work, blocks, sms) if blocks else (0.0, 0)
            for host, (cfg, loader, warps, unroll, feed, slots, gemm_err, be_err) in hosts.items():
                t_fused = gpu_time_ms(lambda blocks=blocks, cfg=cfg, loader=loader, warps=warps, unroll=unroll, feed=feed, slots=slots:
                                      ws_partition.launch_fused(a3, b3, c, [row], epi, cfg, work, 0, blocks, sms, warps=warps,
                                                                loader_regs=loader, unroll=unroll, feed=feed, slots=slots))  # fmt: skip
                overlap = (lc_best + t_be - t_fused) / (lc_best + t_be)
                be_free = 1 - (t_fused - lc_best) / t_be if t_be else float("nan")
                rec = {"shape": name, "mnk": [m, n, k], "be": be, "warps": warps, "unroll": unroll, "feed": feed, "slots": slots,
                       "host": host, "slice_per_program": s, "blocks": blocks,
                       "lc_best": best_name, "lc_best_ms": lc_best, "fused_ms": t_fused, "be_solo_ms": t_be, "be_solo_grid": be_grid,
                       "overlap": overlap, "be_free": be_free, "gemm_err": gemm_err, "be_err": be_err, "solo": solo}  # fmt: skip
                records.append(rec)
                print(f"{name:8s} {be:9s} {host:12s} S={s:3d} blocks {blocks:6d}: fused {t_fused * 1e3:8.2f} us, lc_best "
                      f"{lc_best * 1e3:7.2f}, be solo {t_be * 1e3:8.2f} (grid {be_grid}) -> overlap {overlap:+.3f}, be_free {be_free:+.3f}",
                      flush=True)  # fmt: skip
    return records


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shape, BE kernel and slice: the fastest host tile, and ``be_free`` against ``lc_ref``, the faster of the best
    solo kernel and the fastest host with an idle partition (S = 0) in the same run, so a host tile that beats the solo
    candidates (64 x 128 at six stages was not among them) is not counted as the fusion's gain."""
    ref: dict[str, float] = {}
    for r in records:
        ref[r["shape"]] = min(
            ref.get(r["shape"], r["lc_best_ms"]), r["lc_best_ms"], *([r["fused_ms"]] if r["slice_per_program"] == 0 else [])
        )
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in records:
        k = (r["shape"], r["be"], r["slice_per_program"])
        if k not in best or r["fused_ms"] < best[k]["fused_ms"]:
            best[k] = r
    out = []
    for (shape, be, s), r in best.items():
        lc_ref, t_be = ref[shape], r["be_solo_ms"]
        free = 1 - (r["fused_ms"] - lc_ref) / t_be if t_be else math.nan
        out.append({"shape": shape, "be": be, "S": s, "host": r.get("host", "pp128 s4"), "lc_ref_ms": lc_ref, "x": t_be / lc_ref,
                    "y": r["fused_ms"] / lc_ref, "be_free": free})  # fmt: skip
    return out


def plot(rows: list[dict[str, Any]], gpu: str, path: str) -> None:
    """Per GEMM shape, T_fused / T_ref against the load ratio x = T_be / T_ref for each BE kernel, beside the line of
    running the two one after the other (y = 1 + x) and the GEMM alone (y = 1): the nearer y = 1, the freer the BE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.6), sharey=True)
    for ax, shape in zip(axes, shapes, strict=True):
        xmax = 0.0
        for be in dict.fromkeys(r["be"] for r in rows):
            pts = sorted((r["x"], r["y"]) for r in rows if r["shape"] == shape and r["be"] == be)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=be)
                xmax = max(xmax, pts[-1][0])
        ax.plot([0, xmax], [1, 1 + xmax], "k--", lw=1, label="one after the other")
        ax.axhline(1.0, color="grey", lw=1)
        ax.set_title(f"{shape} (T_ref {rows[[r['shape'] for r in rows].index(shape)]['lc_ref_ms'] * 1e3:.1f} us)")
        ax.set_xlabel("x = BE slice solo / T_ref")
    axes[0].set_ylabel("fused / T_ref")
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"BE in a worker partition of the ping-pong GEMM (fastest host tile), {gpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="", help="folder for the JSON record (required unless --summarize)")
    ap.add_argument("--summarize", default="", help="print the table of a record (``summarize``) and exit: no GPU")
    ap.add_argument("--png", default="", help="with --summarize: also plot the fused curves (``plot``) to this file")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--be", default="histogram,mriq,stencil7,cutcp")
    ap.add_argument("--slices", default="0,1,2,4,8")
    ap.add_argument("--warps", default="4", help="the BE partition's warps (comma-separated: each a host variant)")
    ap.add_argument("--hosts", default=",".join(FUSED), help=f"the host tiles (comma-separated, of: {', '.join(FUSED)})")
    ap.add_argument("--unroll", default="1", help="stencil7's blocks an iteration (comma-separated, of 1, 2, 4: each a variant)")
    ap.add_argument("--feed", default="ldg", help="how stencil7's partition reads its input (comma-separated, of ldg, tma: each a variant)")
    args = ap.parse_args()
    try:
        unrolls = ws_partition.parse_unrolls(args.unroll)
        feeds = ws_partition.parse_feeds(args.feed)
    except ValueError as e:
        ap.error(str(e))
    if unknown := [h for h in args.hosts.split(",") if h not in FUSED]:
        ap.error(f"--hosts: unknown {', '.join(unknown)}")
    for h in [h for h in FUSED if h not in args.hosts.split(",")]:
        del FUSED[h]
    if args.summarize:
        rec = json.loads(Path(args.summarize).read_text())
        print(f"{rec['gpu']}: be_free against the faster of the best solo kernel and the idle-partition host")
        print("{:8s} {:9s} {:>3s} {:12s} {:>9s} {:>6s} {:>6s} {:>8s}".format("shape", "be", "S", "host", "lc_ref us", "x", "y", "be_free"))
        for r in summarize(rec["records"]):
            print(f"{r['shape']:8s} {r['be']:9s} {r['S']:3d} {r['host']:12s} {r['lc_ref_ms'] * 1e3:9.2f} {r['x']:6.2f} {r['y']:6.3f} "
                  f"{r['be_free']:+8.3f}")  # fmt: skip
        if args.png:
            plot(summarize(rec["records"]), rec["gpu"], args.png)
            print(f"wrote {args.png}")
        return
    if not args.out:
        ap.error("--out is required")
    dev = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    records: list[dict[str, Any]] = []
    for name in args.shapes.split(","):
        records += probe_shape(
            name,
            args.be.split(","),
            [int(s) for s in args.slices.split(",")],
            [int(w) for w in args.warps.split(",")],
            dev,
            unrolls,
            feeds,
        )
        (out / "ws_colocate_probe.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "records": records}, indent=1))
    print(f"\n{torch.cuda.get_device_name()}, {time.time() - t0:.0f} s; the fastest host tile per row, BE partition of {args.warps} warps")
    head = ("shape", "be", "S", "host", "lc_best us", "be solo us", "fused us", "overlap", "be_free")
    print("{:8s} {:9s} {:>3s} {:12s} {:>10s} {:>10s} {:>9s} {:>8s} {:>8s}".format(*head))
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in records:
        k = (r["shape"], r["be"], r["slice_per_program"])
        if k not in best or r["fused_ms"] < best[k]["fused_ms"]:
            best[k] = r
    for r in best.values():
        print(f"{r['shape']:8s} {r['be']:9s} {r['slice_per_program']:3d} {r['host']:12s} {r['lc_best_ms'] * 1e3:10.2f} "
              f"{r['be_solo_ms'] * 1e3:10.2f} {r['fused_ms'] * 1e3:9.2f} {r['overlap']:+8.3f} {r['be_free']:+8.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
