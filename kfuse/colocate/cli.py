"""``kfuse colocate``: run the LC/BE co-location experiment and write JSON + PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Co-location of latency-critical inference with best-effort GPU kernels (Aker).", no_args_is_help=True)

LC_MODELS = {"resnet50": ("resnet50", 32, None), "bert-base": ("bert-base", 8, 128), "bert": ("bert-base", 8, 128),
             "resnet-tiny": ("resnet-tiny", 8, None), "bert-tiny": ("bert-tiny", 2, 16), "mlp-tiny": ("mlp-tiny", 8, None)}  # fmt: skip


@app.callback()
def _group() -> None:
    """Co-location of LC inference with BE kernels (Aker): PTB kernels, fusion, QoS-aware scheduling."""


@app.command()
def run(
    lc: str = typer.Option("resnet50", help=f"LC model: {', '.join(LC_MODELS)}"),
    be: str = typer.Option("sgemm,lbm,stencil", help="comma-separated BE kernels"),
    qos_ms: float = typer.Option(0.0, help="QoS target in ms (0: qos-factor x solo latency)"),
    qos_factor: float = typer.Option(5.0, help="QoS = this x solo latency when --qos-ms is 0"),
    load: float = typer.Option(0.8, help="fraction of the highest rate LC alone serves within QoS"),
    seconds: float = typer.Option(2.0, help="length of each policy's run (GPU clock seconds)"),
    backend: str = typer.Option("auto", help="cuda | sim | auto (cuda when a GPU is present)"),
    batch: int = typer.Option(0, help="LC batch (0: the model's default here)"),
    seed: int = typer.Option(0),
    sequences: int = typer.Option(1, help="arrival sequences per policy (p99 pooled; each sequence's p99 reported)"),
    aim: str = typer.Option("priced", help="where Aker aims its fused slices: priced (E from the allowance), average, marginal"),
    aims: str = typer.Option("", help="also run Aker with its fused slices aimed by these rules (comma-separated)"),
    knee_samples: int = typer.Option(0, help="extra profile samples inside each fused curve's first wave step (0: off)"),
    versions: str = typer.Option(
        "",
        help="co-location versions to profile (comma-separated; empty: 1:1,1:2,2:1,1:3): LC:BE program ratios, tail, tailsm, "
        "prio, green<S> (the BE on S SMs of its own, the LC kernel on the rest; any LC kernel), ws (the BE in a worker "
        "partition of the plan's GEMM: --lc-gemms plan-ws)",
    ),
    policies: str = typer.Option(
        "",
        help="policies to run (comma-separated; empty: all of lc_alone, timeshare, streams, aker, partition, backfill, auto; "
        "partition needs a green<S> version, backfill --span-fill, auto a green<S> and a fused version)",
    ),
    span_fill: bool = typer.Option(
        False, "--span-fill", help="profile backfills: BE blocks on the query's own SMs at low priority, beside each partition and alone"
    ),
    lc_gemms: str = typer.Option(
        "ptb",
        help="the LC's GEMMs: ptb (PTB GEMM stand-ins on one tile, which Aker's fused versions can slice), ptb-tuned "
        "(the same, the fastest of a few tiles per shape) or plan (the compiled plan's own kernels: the LC is the kfuse "
        "model itself; only green<S> versions and spans co-run with it) or plan-ptb (each GEMM step as the PTB form of "
        "kfuse's own template with the plan's tile and epilogue, which Aker's fused versions can slice) or plan-ptb2 (the "
        "same, each tile's stages cut so two blocks share an SM) or plan-ws (the plan's own kernels, each GEMM step also "
        "hosting a BE slice in a worker partition of the ping-pong kernel: version ws, sm_90)",
    ),
    lc_tune: str = typer.Option("none", help="kfuse.compile's tuning of the LC model: none (the default tiles), fast or full"),
    ws_warps: str = typer.Option(
        "4,8", help="--lc-gemms plan-ws: the BE partition's warp counts a host tries (4 and / or 8), chosen per BE kernel by time"
    ),
    ws_unroll: str = typer.Option(
        "1", help="--lc-gemms plan-ws: stencil7's BE blocks an iteration a host tries (of 1, 2, 4), checked, then chosen by time"
    ),
    ws_feed: str = typer.Option(
        "ldg", help="--lc-gemms plan-ws: how stencil7's partition reads its input (ldg and / or tma), checked, then chosen by time"
    ),
    be_form: str = typer.Option(
        "fastest",
        help="the BE kernels' PTB form (GPU): fastest (each kernel's fastest right form of 4 / 8 warps on 2 / 4 / 8 "
        "programs an SM or one program a block, timed first: the fair time-sharing baseline) or own (its own warps, 4 "
        "programs an SM)",
    ),
    out_dir: str = typer.Option("colocate_out", "--out", help="output directory"),
) -> None:
    """Serve Poisson LC queries with BE kernels under LC-alone, time sharing, streams, Aker fusion, SM partitions and
    auto (per query, the partition or Aker's fusions, whichever plans the larger gain)."""
    import torch

    import kfuse.models
    from kfuse.colocate import experiment, workloads
    from kfuse.colocate.lc import LC_GEMMS, compile_lc, lc_items
    from kfuse.colocate.pairs import summary as pairs_summary

    out = Path(out_dir)
    if lc_gemms not in LC_GEMMS:
        raise typer.BadParameter(f"--lc-gemms: choose from {', '.join(LC_GEMMS)}, got {lc_gemms!r}")
    if lc not in LC_MODELS:
        raise typer.BadParameter(f"unknown LC model {lc!r}; known: {', '.join(LC_MODELS)}")
    use_cuda = backend == "cuda" or (backend == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise typer.BadParameter("--backend cuda needs a GPU")
    name, b, s = LC_MODELS[lc]
    device = "cuda" if use_cuda else "cpu"
    dtype = torch.float16 if use_cuda else torch.float32
    model, args, kwargs = kfuse.models.build(name, batch=batch or b, seq=s, dtype=dtype, device=device)
    if be_form not in ("fastest", "own"):
        raise typer.BadParameter(f"--be-form: choose from fastest, own, got {be_form!r}")
    if lc_tune not in ("none", "fast", "full"):
        raise typer.BadParameter(f"--lc-tune: choose from none, fast, full, got {lc_tune!r}")
    from kfuse.colocate.ws_partition import parse_feeds, parse_unrolls, parse_warps

    try:
        warps = parse_warps(ws_warps)
        unrolls = parse_unrolls(ws_unroll)
        feeds = parse_feeds(ws_feed)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    compiled = compile_lc(model, args, kwargs, log=typer.echo, backend=None if use_cuda else "torch", tune=lc_tune)
    items = lc_items(compiled, args, kwargs, gemms=lc_gemms, ws_warps=warps, ws_unrolls=unrolls, ws_feeds=feeds)
    be_names = [workloads.resolve(x.strip()) for x in be.split(",") if x.strip()]
    bes = {n: workloads.make(n, small=not use_cuda, device=device) for n in be_names}
    if use_cuda:
        from kfuse.bench.harness import time_ms
        from kfuse.colocate import be_forms, ptb
        from kfuse.colocate.cuda_backend import CudaBackend

        for n, w in bes.items() if be_form == "fastest" else ():
            form, _ = be_forms.choose(w, lambda f: time_ms(f, warmup=1, rep=10), ptb.num_sms())
            typer.echo(f"BE {n}: time sharing runs {form} (fastest right PTB form)")

        gpu = CudaBackend(items, bes)
    else:
        from kfuse.colocate.sim import from_items

        gpu = from_items(items, bes, seed)
    if sequences < 1:
        raise typer.BadParameter("--sequences must be at least 1")
    if knee_samples < 0:
        raise typer.BadParameter("--knee-samples must be 0 or more")
    from kfuse.colocate.predictor import AIM_RULES
    from kfuse.colocate.scheduler import POLICIES

    run_policies = [p.strip() for p in policies.split(",") if p.strip()] or list(POLICIES)
    if unknown := [p for p in run_policies if p not in POLICIES]:
        raise typer.BadParameter(f"--policies: unknown {', '.join(unknown)}; choose from {', '.join(POLICIES)}")

    aim_rules = [r.strip() for r in aims.split(",") if r.strip()]
    if any(r not in AIM_RULES for r in (aim, *aim_rules)):
        raise typer.BadParameter(f"--aim / --aims: choose from {', '.join(AIM_RULES)}")
    from kfuse.colocate.fuser import DEFAULT_VERSIONS, parse_version

    try:
        chosen = tuple(parse_version(v) for v in versions.split(",") if v.strip()) or DEFAULT_VERSIONS
    except ValueError as e:
        raise typer.BadParameter(f"--versions: {e}") from e
    # on the GPU, solo and the max rate are measured on the backend's own clock (calibrate)
    res = experiment.run_experiment(gpu, be_names, qos_ms or None, qos_factor, load, seconds, seed=seed, sequences=sequences,
                                    calibrate=use_cuda, aim=aim, aims=aim_rules, knee_samples=knee_samples,
                                    versions=chosen, policies=run_policies, span_fill=span_fill)  # fmt: skip
    cmd = f"kfuse colocate run --lc {lc} --be {be} --qos-ms {qos_ms} --load {load} --seconds {seconds} --backend {backend}"
    cmd += f" --be-form {be_form}" if use_cuda else ""
    cmd += f" --sequences {sequences}" if sequences > 1 else ""
    cmd += f" --aim {aim}" + (f" --aims {aims}" if aim_rules else "")
    cmd += f" --knee-samples {knee_samples}" if knee_samples else ""
    cmd += f" --versions {versions}" if versions else ""
    cmd += f" --policies {policies}" if policies else ""
    cmd += " --span-fill" if span_fill else ""
    cmd += f" --lc-gemms {lc_gemms}" if lc_gemms != "ptb" else ""
    cmd += f" --lc-tune {lc_tune}" if lc_tune != "none" else ""
    recs = experiment.records(res, lc, cmd)
    # the form time sharing ran each BE kernel in: the baseline every gain is measured against
    forms = {n: str(be_forms.current(w, gpu.be_grid // gpu.sms)) for n, w in bes.items()} if use_cuda else None
    for r in recs:
        r["backend"] = "cuda" if use_cuda else "sim"
        r["lc_gemms"] = lc_gemms
        r["lc_tune"] = lc_tune
        if forms is not None:
            r["be_forms"] = forms
    out.mkdir(parents=True, exist_ok=True)
    (out / "colocate.json").write_text(json.dumps(recs, indent=2, default=str))
    pred = {"lc": lc, "heldout": res["predictor_heldout"], "chosen": res["chosen"]}
    (out / "predictor.json").write_text(json.dumps(pred, indent=2, default=str))
    plots = experiment.plot(res, lc, out)
    typer.echo(f"{'case':24s} {'policy':15s} {'p99 ms':>9s} {'QoS ms':>8s} {'viol':>5s} {'BE/s':>9s} {'vs TS':>7s}")
    for r in recs:
        g = r["be_gain_vs_timesharing"]
        typer.echo(f"{r['case']:24s} {r['policy']:15s} {r['p99_ms']:9.3f} {r['qos_ms']:8.3f} {r['violations']:5d} "
                   f"{r['be_throughput']:9.2f} {'' if g is None else f'{g:+.1%}':>7s}")  # fmt: skip
    if table := pairs_summary(recs):  # each pair's best policy that kept QoS, and the mean per LC (the issue's +30%)
        typer.echo("\n" + table)
    typer.echo(f"wrote {out / 'colocate.json'}, {out / 'predictor.json'}, " + ", ".join(str(p) for p in plots))


@app.command()
def pairs(
    files: Annotated[
        list[str] | None, typer.Argument(help="colocate JSON files (default: benchmarks/results/*/colocate*.json here)")
    ] = None,
    png: str = typer.Option("", help="also plot one GPU's pairs to this PNG"),
    gpu: str = typer.Option("H100", help="the table to plot: a part of its name (GPU, LC form: 'H100, LC: as kfuse')"),
) -> None:
    """The per-pair table from co-location records: each policy's BE throughput gain over time sharing (measured in
    the same run), the best policy that kept QoS, its p99 and violations, and the mean of the best per LC."""
    from kfuse.colocate import pairs as P

    paths = files or P.default_files()
    if not paths:
        raise typer.BadParameter("no colocate JSON files given, and none under benchmarks/results/ here")
    if missing := [f for f in paths if not Path(f).is_file()]:
        raise typer.BadParameter(f"no such file: {', '.join(missing)}")
    table = P.pairs(P.load(paths))
    if not table:
        raise typer.BadParameter(f"no LC x BE records with a gain over time sharing in {', '.join(paths)}")
    typer.echo(P.markdown(table))
    if png:
        typer.echo(f"wrote {P.plot_pairs(table, png, gpu)}")


if __name__ == "__main__":
    app()
