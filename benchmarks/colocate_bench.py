"""Co-location benchmark (issue 8): LC = ResNet-50 (batch 32) and BERT-base (B=8, S=128) compiled by
kfuse, BE = sgemm (compute), lbm and stencil7 (memory); policies LC alone, time sharing (Baymax-like),
concurrent streams and Aker fusion. QoS = 5x the solo latency, load = 80% of the highest Poisson
rate LC alone serves within QoS.

    PYTHONPATH=. python benchmarks/colocate_bench.py --out $OUT --lc resnet50 --be sgemm,lbm --max-keys 6 --seconds 1.0  # H200, ~120 s
    PYTHONPATH=. python benchmarks/colocate_bench.py --out /tmp/x --smoke  # CPU, interpreter, tiny

Writes colocate.json (one record per LC x BE pair and policy), predictor.json (held-out errors of
the duration predictor, chosen fused versions, BE workload classification) and PNG plots.
Budget: the BE subset is 3 kernels and every policy run serves ~1.5 s of GPU time (see docs/colocate.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (Triton interpreter)")
    ap.add_argument("--seconds", type=float, default=1.5, help="GPU-clock length of each policy run")
    ap.add_argument("--lc", default="resnet50,bert-base")
    ap.add_argument("--be", default="sgemm,lbm,stencil7")
    ap.add_argument(
        "--versions",
        default="tail,1:1,1:2",
        help="versions to profile: LC:BE ratios (1:2, 1:2il interleaved), tail / tailsm (tail fill), "
        "prio (two kernels on prioritized streams), green<S> (SM partitions), ws (the BE in a worker partition of the "
        "plan's GEMM: --lc-gemms plan-ws)",
    )
    ap.add_argument(
        "--policies",
        default="",
        help="policies to run (comma-separated; empty: all of lc_alone, timeshare, streams, aker, partition, backfill, auto; "
        "partition runs only with a green<S> version, backfill with --span-fill, auto with a green<S> and a fused version)",
    )
    ap.add_argument("--max-keys", type=int, default=8, help="fuse only the LC GEMM/conv shapes with the most time")
    ap.add_argument("--be-programs-per-sm", type=int, default=4,
                    help="with --be-form own: the BE kernels' PTB grid for time sharing and the profile's x "
                         "(benchmarks/experiments/be_solo_forms.py times the forms)")  # fmt: skip
    ap.add_argument("--be-form", choices=("own", "fastest"), default="fastest",
                    help="the BE kernels' PTB form for time sharing and the profile's x: each kernel's own warps on "
                         "--be-programs-per-sm, or the fastest right form of 4 / 8 warps on 2 / 4 / 8 programs an SM or "
                         "one program a block, timed per kernel first (kfuse.colocate.be_forms)")  # fmt: skip
    ap.add_argument("--be-warps", type=int, default=0,
                    help="with --be-form own: the BE kernels' warps a program for time sharing and the profile's x "
                         "(0: each kernel's own; be_solo_forms.py --warps times them)")  # fmt: skip
    ap.add_argument(
        "--load", type=float, default=0.8, help="LC arrival rate as a fraction of the highest rate at which LC alone meets QoS at p99"
    )
    ap.add_argument("--sequences", type=int, default=1, help="arrival sequences per policy (p99 pooled, each reported)")
    ap.add_argument("--qos-factor", type=float, default=5.0, help="QoS target = this x the LC query's solo time")
    ap.add_argument("--aim", default="priced", help="where Aker aims its fused slices: priced (E from the allowance), average, marginal")
    ap.add_argument("--knee-samples", type=int, default=0, help="extra profile samples inside each fused curve's first wave step")
    ap.add_argument("--classify", choices=("all", "selected"), default="all",
                    help="BE kernels whose utilisation is measured and classified: all eight, or only those of --be")  # fmt: skip
    ap.add_argument("--aims", default="", help="also run Aker aimed by these rules (comma-separated), as policy aker_<rule>")
    ap.add_argument("--be-each", action="store_true",
                    help="one experiment per BE kernel on one compiled LC, results written after each (a time-out keeps them)")  # fmt: skip
    ap.add_argument("--span-fill", action="store_true",
                    help="also profile the partitions (green<S>) with low-priority BE backfills on the query's SMs")  # fmt: skip
    ap.add_argument("--lc-gemms", choices=("ptb", "ptb-tuned", "plan", "plan-ptb", "plan-ptb2", "plan-ws"), default="ptb",
                    help="the LC's GEMMs: PTB stand-ins (Aker can slice them) on one tile or on a tile per shape, the "
                         "compiled plan's own kernels, or the PTB form of kfuse's own template with the plan's tiles and "
                         "epilogues (Aker can slice them), plan-ptb2 with their stages cut so two blocks share an SM, "
                         "plan-ws the plan's own kernels whose GEMM steps also host a BE slice (version ws)")  # fmt: skip
    ap.add_argument("--lc-tune", choices=("none", "fast", "full"), default="none",
                    help="kfuse.compile's tuning of the LC model (none: the default tiles, every record before session 55)")  # fmt: skip
    ap.add_argument("--ws-warps", default="4,8",
                    help="--lc-gemms plan-ws: the BE partition's warp counts each host tries (comma-separated, 4 and / or 8; "
                         "each one more Gluon compile per host tile and BE kernel)")  # fmt: skip
    ap.add_argument("--ws-unroll", default="1",
                    help="--lc-gemms plan-ws: stencil7's BE blocks an iteration each host tries (comma-separated, of 1, 2, 4: "
                         "more bytes in flight for more registers; every candidate is checked against the references first)")  # fmt: skip
    ap.add_argument("--ws-feed", default="ldg",
                    help="--lc-gemms plan-ws: how stencil7's partition reads its input (comma-separated, ldg and / or tma: "
                         "TMA copies each block's windows into a ring of shared memory; checked first, then chosen by time)")  # fmt: skip
    a = ap.parse_args()
    if not 0.0 < a.load <= 1.0 or a.qos_factor <= 1.0:
        ap.error("--load must be in (0, 1] and --qos-factor above 1")
    if a.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    import kfuse.models
    from kfuse.bench.harness import pytorch_baselines, time_ms, write_results
    from kfuse.colocate import be_forms, cuda_backend, experiment, ptb, workloads
    from kfuse.colocate.cuda_backend import CudaBackend
    from kfuse.colocate.fuser import parse_version
    from kfuse.colocate.lc import compile_lc, lc_items, plan_gemm_summary, ws_host_summary
    from kfuse.colocate.pairs import summary as pairs_summary
    from kfuse.colocate.ws_partition import parse_feeds, parse_unrolls, parse_warps

    try:
        ws_warps = parse_warps(a.ws_warps)
        ws_unrolls = parse_unrolls(a.ws_unroll)
        ws_feeds = parse_feeds(a.ws_feed)
    except ValueError as e:
        ap.error(str(e))

    t_start = time.perf_counter()

    def stamped(msg: str) -> None:
        """The experiment's log lines with the seconds since start, so a cut-off run shows where its time went."""
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)

    gpu = torch.cuda.is_available() and not a.smoke
    device = "cuda" if gpu else "cpu"
    dtype = torch.float16 if gpu else torch.float32
    # the command as run, with $OUT for the output folder (session 7 and 8 records lacked --lc / --be)
    argv = list(sys.argv[1:])
    if "--out" in argv:
        argv[argv.index("--out") + 1] = "$OUT"
    cmd = "PYTHONPATH=. python benchmarks/colocate_bench.py " + " ".join(argv)
    be_names = [workloads.resolve(x) for x in a.be.split(",")]
    if a.smoke:
        lcs = [("mlp-tiny", 4, None)]
        be_names = be_names[:1]
    else:
        lcs = [{"resnet50": ("resnet50", 32, None), "bert-base": ("bert-base", 8, 128)}[x] for x in a.lc.split(",")]

    # ---- BE workloads: correctness and classification from measured utilisation ----------------
    pred_records: list[dict] = []
    classify = workloads.NAMES if gpu and a.classify == "all" else be_names
    bes = {}
    for name in classify:
        try:
            w = workloads.make(name, small=not gpu, device=device)
            if a.be_warps:
                w.kernel.num_warps = a.be_warps
            if a.be_form == "fastest":
                best, forms = be_forms.choose(w, lambda f: time_ms(f, warmup=1, rep=10 if gpu else 1), ptb.num_sms())
                cells = "  ".join(f"{f} {'wrong' if t is None else f'{t:.4f}'}" for f, t in sorted(forms.items()))
                print(f"BE {name:10s} forms (ms): {cells}  -> {best}", flush=True)
                pred_records.append({"benchmark": "colocate_workload", "case": name, "kind": "be_form", "form": str(best),
                                     "forms_ms": {str(f): t for f, t in forms.items()}, "command": cmd})  # fmt: skip
            k = w.kernel
            grid = be_forms.grid(w, k.n_blocks, ptb.num_sms(), a.be_programs_per_sm)
            w.reset()
            ptb.launch_ptb(k, grid=grid)
            err = workloads.error(w)
            ms = time_ms(lambda k=k: ptb.launch_ptb(k, grid=grid), warmup=2, rep=5 if gpu else 1)
            cls, cu, mu = workloads.classify(k.flops_per_block * k.n_blocks / (ms / 1e3), k.bytes_per_block * k.n_blocks / (ms / 1e3))
            pred_records.append({"benchmark": "colocate_workload", "case": name, "kind": "classification", "ms": ms, "blocks": k.n_blocks,
                                 "compute_util": cu, "memory_util": mu, "class": cls, "nominal_class": w.nominal_class,
                                 "max_rel_err": err, "ok": err <= max(w.tol, 1e-6), "command": cmd})  # fmt: skip
            print(f"BE {name:10s} {ms:8.3f} ms  compute {cu:6.1%}  memory {mu:6.1%}  -> {cls:8s} err {err:.2e}", flush=True)
            if name in be_names:
                bes[name] = w
        except Exception as e:
            print(f"BE {name}: FAILED {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()

    records: list[dict] = []
    for lc_name, batch, seq in lcs:
        try:
            t0 = time.perf_counter()
            model, args, kwargs = kfuse.models.build(lc_name, batch=batch, seq=seq, dtype=dtype, device=device)
            compiled = compile_lc(model, args, kwargs, tune=a.lc_tune)
            items = lc_items(compiled, args, kwargs, gemms=a.lc_gemms, ws_warps=ws_warps, ws_unrolls=ws_unrolls, ws_feeds=ws_feeds)
            n_gemm = sum(it.kernel is not None for it in items)
            n_host = sum(it.host is not None for it in items)
            dt = time.perf_counter() - t0
            hosts = f", {n_host} plan GEMMs hosting a worker partition" if a.lc_gemms == "plan-ws" else ""
            print(f"\n{lc_name}: compiled in {dt:.1f} s; {len(items)} LC kernels ({n_gemm} PTB GEMM/conv{hosts})", flush=True)
            lc_tiles = {it.key: it.kernel.meta["tile_ms"] for it in items if it.kernel is not None and "tile_ms" in it.kernel.meta}
            for shape, tms in lc_tiles.items():  # --lc-gemms ptb-tuned: each shape's tiles, the chosen one first
                print(
                    f"  tile for {shape}: " + ", ".join(f"{t} {ms:.4f} ms" for t, ms in sorted(tms.items(), key=lambda kv: kv[1])),
                    flush=True,
                )
            lc_plan_gemms = plan_gemm_summary(items)
            for key, g in lc_plan_gemms.items():  # --lc-gemms plan-ptb: each shape's PTB form against the plan's kernel
                vs = f"; PTB {g['ptb_ms']:.4f} ms vs plan {g['plan_ms']:.4f} ms" if g.get("plan_ms") else ""
                changed = f"; changed: {'; '.join(g['changed'])}" if g["changed"] else ""
                print(f"  plan GEMM x{g['count']} {key.split(':')[0]}: {g['tile']} {g['form']}, {g['programs_per_sm']}/SM{vs}; "
                      f"plan: {g['plan_kernel']}{changed}", flush=True)  # fmt: skip
                if g.get("fit_ms"):  # plan-ptb2 on a GPU: the tiles that fit two an SM, each timed
                    print("    fit: " + ", ".join(f"{t} {ms * 1e3:.1f} us" for t, ms in sorted(g["fit_ms"].items(), key=lambda kv: kv[1])),
                          flush=True)  # fmt: skip
            if lc_plan_gemms and all(g.get("plan_ms") for g in lc_plan_gemms.values()):
                tot = {w: sum(g[w] * g["count"] for g in lc_plan_gemms.values()) for w in ("ptb_ms", "plan_ms")}
                print(f"  plan GEMMs in all: PTB {tot['ptb_ms']:.4f} ms vs plan {tot['plan_ms']:.4f} ms", flush=True)
            base, _, _ = pytorch_baselines(model, args, kwargs, which=("eager",), warmup=2, rep=5)
            kf_ms = time_ms(lambda: compiled(*args, **kwargs), warmup=2, rep=5)
            # chooses each host's tile and warps per BE kernel, before the runs
            backend = CudaBackend(items, bes, be_programs_per_sm=a.be_programs_per_sm)
            print(f"  {backend.graphed_segments} of {len(backend.segments)} segments replay from CUDA graphs", flush=True)
            versions = tuple(parse_version(v, backend.lc_grid // backend.sms) for v in a.versions.split(","))
            versions = versions if gpu else versions[:2]
            # --be-each: one experiment per BE kernel on the one compiled LC, its results written as soon as it ends; the
            # LC's own calibration (solo latency, max LC-alone rate) measured in the first and reused by the others
            lc_calibration: dict[str, float] = {}
            for group in [[b] for b in bes] if a.be_each else [list(bes)]:
                res = experiment.run_experiment(
                    backend, group, load=a.load, qos_factor=a.qos_factor, seconds=a.seconds, versions=versions, reps=2 if gpu else 1,
                    min_queries=100 if gpu else 8, max_queries=600 if gpu else 8,
                    fit_ratios=None if gpu else (0.5, 1.0, 2.0, 3.0), max_fuse_keys=a.max_keys, calibrate=True, warmup_queries=8,
                    sequences=a.sequences, aim=a.aim, aims=[r for r in a.aims.split(",") if r], knee_samples=a.knee_samples,
                    **({"policies": [p for p in a.policies.split(",") if p]} if a.policies else {}),
                    log=stamped, span_fill=a.span_fill, lc_calibration=lc_calibration,
                )  # fmt: skip
                recs = experiment.records(res, lc_name, cmd + f"  # LC {lc_name}")
                ws_hosts = ws_host_summary(items)
                for key, h in ws_hosts.items():  # --lc-gemms plan-ws: each step's host tile per BE kernel
                    print(f"  ws host x{h['count']} {key}: plan {h['plan_kernel']}; " + "; ".join(
                        f"{be} on {t} ({', '.join(f'{n} {ms * 1e3:.1f} us' for n, ms in h['times'].get(be, {}).items())})"
                        for be, t in h["chosen"].items()), flush=True)  # fmt: skip
                    for be, why in h["rejected"].items():
                        print(f"  ws host {key}: {be} candidates WRONG, never chosen: {why}", flush=True)
                # the form time sharing ran each BE kernel in (the baseline every gain is measured against)
                forms_run = {n: str(be_forms.current(bes[n], a.be_programs_per_sm)) for n in group}
                for r in recs:
                    r["lc_ws_hosts"] = ws_hosts
                    r.update({"kfuse_ms": kf_ms, "baselines_ms": base, "lc_kernels": len(items), "ptb_gemm_kernels": n_gemm,
                              "lc_gemms": a.lc_gemms, "lc_tune": a.lc_tune, "lc_tiles": lc_tiles, "lc_plan_gemms": lc_plan_gemms,
                              "load": a.load, "qos_factor": a.qos_factor,
                              "launches": backend.launches, "dtype": str(dtype).replace("torch.", "")})  # fmt: skip
                    r["be_forms"] = forms_run
                records += recs
                pred_records.append({"benchmark": "colocate_predictor", "case": lc_name, "kind": "predictor", "command": cmd,
                                     "heldout": res["predictor_heldout"], "chosen": res["chosen"],
                                     "online_error": {f"{b}|{q}": r.summary()["online_error"]
                                                      for (b, q), r in res["runs"].items() if q == "aker"},
                                     "refits": {f"{b}|{p}": r.refits for (b, p), r in res["runs"].items() if p == "aker"},
                                     "overlap": res["overlap"], "measured_overlap": res["measured_overlap"],
                                     "be_fit": res["be_fit"], "plans": res["plans"], "error_bounds": res["error_bounds"],
                                     "samples": res["samples"], "decisions": {f"{b}|{q}": r.decisions for (b, q), r in res["runs"].items()
                                                                               if q == "aker"},
                                     "graphed_segments": backend.graphed_segments,
                                     "preroll": dict(cuda_backend.PREROLL)})  # fmt: skip
                experiment.plot(res, f"{lc_name}_{group[0]}" if a.be_each else lc_name, a.out)
                if a.be_each:
                    write_results("colocate", records, a.out)
                    write_results("predictor", pred_records, a.out)
        except Exception as e:
            print(f"{lc_name}: FAILED {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        write_results("colocate", records, a.out)
        write_results("predictor", pred_records, a.out)

    print(f"\n{'case':22s} {'policy':15s} {'p99 ms':>9s} {'QoS ms':>8s} {'viol':>5s} {'BE/s':>9s} {'vs TS':>7s}")
    for r in records:
        g = r["be_gain_vs_timesharing"]
        print(f"{r['case']:22s} {r['policy']:15s} {r['p99_ms']:9.3f} {r['qos_ms']:8.3f} {r['violations']:5d} "
              f"{r['be_throughput']:9.2f} {'' if g is None else f'{g:+.1%}':>7s}")  # fmt: skip
    for p in pred_records:
        if p["kind"] == "predictor":
            h = p["heldout"]["fused_two_stage"]
            print(f"predictor {p['case']}: fused held-out error mean {h['mean']:.1%} max {h['max']:.1%} (n={h['n']})")
            lo = p["heldout"].get("fused_samples_loo", {})
            if lo.get("n"):
                print(f"  planning model leave-one-out error mean {lo['mean']:.1%} p90 {lo['p90']:.1%} max {lo['max']:.1%}")
            for be, ov in p["overlap"].items():
                print(f"  overlap {p['case']}+{be}: " + ", ".join(f"{o['key']} {o['version']} {o['overlap']:.1%}" for o in ov))
            for be, fit in p.get("be_fit", {}).items():
                # a block's own duration on the BE grid: a slice fits in an LC kernel only if this is shorter
                per_sm = be_forms.current(bes[be], a.be_programs_per_sm).programs_per_sm if be in bes else a.be_programs_per_sm
                # a block's own duration on a persistent grid (one program a block: not known from the fit)
                on_grid = f" (~{fit['b_ms_per_block'] * per_sm * ptb.num_sms() * 1e3:.1f} us a block on its grid)" if per_sm else ""
                print(f"  BE fit {be}: launch cost a {fit['a_ms']:.4f} ms, {fit['b_ms_per_block'] * 1e6:.1f} ns/block"
                      f"{on_grid}, kernel {fit['kernel_ms']:.4f} ms")  # fmt: skip
            for be, plans in p.get("plans", {}).items():
                for key, pl in plans.items():
                    print(f"  plan {key}|{be}: {pl['reason']}" + (f" blocks {pl['blocks']} extra {pl['extra_ms']:.4f} ms saving "
                          f"{pl['saving_ms']:.4f} ms error bound {pl['error_bound']:.1%}" if "blocks" in pl else ""))  # fmt: skip
            for run, dec in p.get("decisions", {}).items():
                print(f"  decisions {run}: {dec}")
            pr = p.get("preroll", {})
            if pr:
                print(f"  timing pre-roll {pr.get('ms', 0):.3f} ms, max enqueue {pr.get('max_enqueue_ms', 0):.3f} ms, "
                      f"uncovered {int(pr.get('uncovered', 0))}, retimed {int(pr.get('retimed', 0))}")  # fmt: skip
            for pair, per_v in p["measured_overlap"].items():
                print(f"  best measured overlap {pair}: " + ", ".join(f"{v} {o:+.1%}" for v, o in per_v.items()))
    if table := pairs_summary(records):  # each pair's best policy that kept QoS, and the mean per LC
        print("\n" + table)
    print(f"total {time.perf_counter() - t_start:.1f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
